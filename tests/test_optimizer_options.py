"""Every optimizer the template renders is built with exactly the options its answer and flags
imply. build_optimizer's optimizer is compared with one written out here by hand from torch's
classes (for LAMB and LARS, the project's own classes, which tests/test_lamb_lars.py checks
against an independent implementation): the same class, the same hyper-parameters in the same
groups of parameters, and after three steps on the same gradients the same parameters and the
same optimizer state, bit for bit. The options are given at their defaults and at other values,
so that an option dropped (torch's default taken instead) cannot pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.optim import SGD, Adadelta, Adagrad, Adam, AdamW, NAdam, RMSprop

from tests.helpers import OPTIMIZERS, inside, render

CPU, OTHER = torch.device("cpu"), torch.device("mps")  # mps: a device without fused kernels


def groups(model: nn.Sequential, weight_decay: float, **no_decay) -> list[dict]:
    """The two groups the README promises: weight matrices decayed; biases and the norm's
    weights not (and the frozen layer in neither)."""
    first, norm, _, last, _ = model
    return [
        {"params": [first.weight, last.weight], "weight_decay": weight_decay},
        {
            "params": [first.bias, norm.weight, norm.bias, last.bias],
            "weight_decay": 0.0,
            **no_decay,
        },
    ]


def plain(model, weight_decay):
    return groups(model, weight_decay)


def layerwise(model, weight_decay):
    return groups(model, weight_decay, trust_ratio=False)  # biases and norms: plain steps


# Per optimizer: (flags, the optimizer they must give, built by hand). `fast` is FUSED on the
# CPU, or {"foreach": True} on a device without fused kernels, for the optimizers that have
# them; `own` holds the project's Lamb and Lars.
CASES = {
    "sgd": [
        ([], lambda m, fast, own: SGD(plain(m, 5e-4), lr=0.2, momentum=0.9, nesterov=True, **fast)),
        (
            ["--lr", "0.05", "--momentum", "0.5", "--weight-decay", "0.01"],
            lambda m, fast, own: SGD(plain(m, 0.01), lr=0.05, momentum=0.5, nesterov=True, **fast),
        ),
        (["--momentum", "0"], lambda m, fast, own: SGD(plain(m, 5e-4), lr=0.2, **fast)),
    ],
    "adam": [
        ([], lambda m, fast, own: Adam(plain(m, 0.0), lr=0.016, betas=(0.9, 0.999), **fast)),
        (
            ["--lr", "0.01", "--beta1", "0.8", "--beta2", "0.95", "--weight-decay", "0.1"],
            lambda m, fast, own: Adam(plain(m, 0.1), lr=0.01, betas=(0.8, 0.95), **fast),
        ),
    ],
    "adamw": [
        ([], lambda m, fast, own: AdamW(plain(m, 0.05), lr=0.016, betas=(0.9, 0.999), **fast)),
        (
            ["--lr", "0.01", "--beta1", "0.8", "--beta2", "0.95", "--weight-decay", "0.1"],
            lambda m, fast, own: AdamW(plain(m, 0.1), lr=0.01, betas=(0.8, 0.95), **fast),
        ),
    ],
    "nadam": [
        (
            [],
            lambda m, fast, own: NAdam(
                plain(m, 0.0), lr=0.016, betas=(0.9, 0.999), decoupled_weight_decay=True
            ),
        ),
        (
            ["--lr", "0.01", "--beta1", "0.8", "--beta2", "0.95", "--weight-decay", "0.1"],
            lambda m, fast, own: NAdam(
                plain(m, 0.1), lr=0.01, betas=(0.8, 0.95), decoupled_weight_decay=True
            ),
        ),
    ],
    "rmsprop": [
        ([], lambda m, fast, own: RMSprop(plain(m, 0.0), lr=0.001, alpha=0.99, momentum=0.0)),
        (
            ["--lr", "0.01", "--alpha", "0.9", "--momentum", "0.5", "--weight-decay", "0.1"],
            lambda m, fast, own: RMSprop(plain(m, 0.1), lr=0.01, alpha=0.9, momentum=0.5),
        ),
    ],
    "adagrad": [
        ([], lambda m, fast, own: Adagrad(plain(m, 0.0), lr=0.05, **fast)),
        (
            ["--lr", "0.1", "--weight-decay", "0.1"],
            lambda m, fast, own: Adagrad(plain(m, 0.1), lr=0.1, **fast),
        ),
    ],
    "adadelta": [
        ([], lambda m, fast, own: Adadelta(plain(m, 0.0), lr=1.0, rho=0.9)),
        (
            ["--lr", "0.5", "--rho", "0.8", "--weight-decay", "0.1"],
            lambda m, fast, own: Adadelta(plain(m, 0.1), lr=0.5, rho=0.8),
        ),
    ],
    "lamb": [
        ([], lambda m, fast, own: own.Lamb(layerwise(m, 0.02), lr=0.04, betas=(0.9, 0.999))),
        (
            ["--lr", "0.05", "--beta1", "0.8", "--beta2", "0.95", "--weight-decay", "0.1"],
            lambda m, fast, own: own.Lamb(layerwise(m, 0.1), lr=0.05, betas=(0.8, 0.95)),
        ),
    ],
    "lars": [
        (
            [],
            lambda m, fast, own: own.Lars(
                layerwise(m, 5e-4), lr=2.0, momentum=0.9, trust_coefficient=0.001
            ),
        ),
        (
            ["--lr", "0.5", "--momentum", "0.5", "--trust-coefficient", "0.01"]
            + ["--weight-decay", "0.1"],
            lambda m, fast, own: own.Lars(
                layerwise(m, 0.1), lr=0.5, momentum=0.5, trust_coefficient=0.01
            ),
        ),
    ],
}
assert CASES.keys() == set(OPTIMIZERS)
HAS_FUSED = ("sgd", "adam", "adamw", "adagrad")


@pytest.fixture(scope="module")
def rendered(template, tmp_path_factory):
    """Per optimizer, rendered once: its train.py's flag parser and its optim module."""
    projects = {}

    def get(name: str) -> SimpleNamespace:
        if name not in projects:
            project = render(
                template, tmp_path_factory.mktemp(name) / "p", optimizer=name, extras=[]
            )
            with inside(project):
                import train
                from proj import optim

                projects[name] = SimpleNamespace(parser=train.get_args_parser(), optim=optim)
        return projects[name]

    return get


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))
    frozen = nn.Linear(3, 3)
    frozen.requires_grad_(False)
    return model.append(frozen)


def assert_same_state(ours: dict, reference: dict, where: str) -> None:
    assert ours.keys() == reference.keys(), where
    for key, value in reference.items():
        if torch.is_tensor(value):
            assert torch.equal(ours[key], value), f"{where}: {key}"
        else:
            assert ours[key] == value, f"{where}: {key}"


CASE_IDS = [(name, i) for name in OPTIMIZERS for i in range(len(CASES[name]))]
DEVICES = [(name, i, device) for name, i in CASE_IDS for device in (CPU, OTHER)]


@pytest.mark.parametrize(
    ("name", "case", "device"),
    [(name, i, device) for name, i, device in DEVICES if device == CPU or name in HAS_FUSED],
    ids=lambda value: str(value),
)
def test_the_optimizer_is_built_with_the_options_its_answer_and_flags_imply(
    rendered, name, case, device
):
    project = rendered(name)
    flags, by_hand = CASES[name][case]
    args = project.parser.parse_args(flags)
    ours_model, reference_model = make_model(), make_model()
    ours = project.optim.build_optimizer(ours_model, args, device)
    fast = ({"fused": True} if device == CPU else {"foreach": True}) if name in HAS_FUSED else {}
    reference = by_hand(reference_model, fast, project.optim)

    assert type(ours) is type(reference)
    index = {id(p): i for i, p in enumerate(ours_model.parameters())}
    reference_index = {id(p): i for i, p in enumerate(reference_model.parameters())}
    assert len(ours.param_groups) == len(reference.param_groups)
    for group, expected in zip(ours.param_groups, reference.param_groups, strict=True):
        assert [index[id(p)] for p in group["params"]] == [
            reference_index[id(p)] for p in expected["params"]
        ]
        settings = {k: v for k, v in group.items() if k != "params"}
        assert settings == {k: v for k, v in expected.items() if k != "params"}

    gen = torch.Generator().manual_seed(1)
    for step in range(3):  # Adam's betas, for one, show only from the second step
        for p, q in zip(ours_model.parameters(), reference_model.parameters(), strict=True):
            if p.requires_grad:
                p.grad = torch.randn(p.shape, generator=gen)
                q.grad = p.grad.clone()
        ours.step()
        reference.step()
        for (label, p), q in zip(
            ours_model.named_parameters(), reference_model.parameters(), strict=True
        ):
            assert torch.equal(p, q), f"step {step + 1}: {label}"
    for p, q in zip(ours_model.parameters(), reference_model.parameters(), strict=True):
        assert_same_state(ours.state[p], reference.state[q], str(index[id(p)]))
    # The steps moved every trained parameter: the comparison was not of untouched weights.
    for p, q in zip(ours_model.parameters(), make_model().parameters(), strict=True):
        assert torch.equal(p, q) != p.requires_grad
