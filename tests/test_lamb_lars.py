"""Step-by-step checks of the template's Lamb and Lars optimizers.

The two files are plain Python inside the template and are loaded straight from their paths
(no rendering). They are compared, parameter by parameter after every step and in float64,
with the independent implementations ``pytorch_optimizer.Lamb`` and ``pytorch_optimizer.LARS``
(checked against pytorch_optimizer 4.1.0). The definitions differ as follows; each difference
is either configured away, bridged exactly, or checked by a short explicit reference here.

Lamb (ours) vs pytorch_optimizer.Lamb (theirs):

1. Bias correction. Ours divides m by bc1 = 1 - beta1**t and v by bc2 = 1 - beta2**t inside
   the update direction. Theirs uses the raw m and v in the direction, and by default divides
   the step size by bc1 (``adam_debias=False``), after the trust ratio, so it is not cancelled.
   Bridged exactly: our update equals c * (m / (sqrt(v) + eps * sqrt(bc2)) + wd * bc1 /
   sqrt(bc2) * p) with c = sqrt(bc2) / bc1. Theirs runs with ``adam_debias=True`` and, before
   step t, eps_t = eps * sqrt(bc2) and weight_decay_t = wd * bc1 / sqrt(bc2); c cancels in
   the trust ratio, and groups without trust ratio get lr_t = lr * c.
2. Weight decay. Ours adds wd * p to the update, so it enters the trust ratio. Theirs by default
   (``weight_decouple=True``) multiplies p by 1 - lr * wd before the step, outside the trust
   ratio. Configured: ``weight_decouple=False`` adds wd * p to the update as ours does.
3. Trust ratio. Ours ||p|| / ||r||; theirs ||p|| / (||r|| + eps), with ||p|| clamped to at most
   10 (class attribute ``clamp``). Neither is configurable. The comparison runs twice: with
   eps = 1e-12 in the trust groups, where the eps term vanishes and the match is to rounding
   (tolerance 1e-12), and with the default eps = 1e-6, where it moves the parameters by up to
   ~3e-9 in 20 steps (tolerance 1e-7, torch's float64 default). The test asserts that every
   weight norm stays below 10, so the clamp never acts. Both use 1 when either norm is 0;
   neither clips the ratio otherwise.
4. Groups without trust ratio. Ours: per-group ``trust_ratio=False``; theirs: per-group
   ``adam=True``. Both then step by lr * r, decay term included. Those groups are given a
   large eps here: with no trust ratio, theirs has no eps outside the Adam denominator, so the
   comparison is exact and checks where ours puts eps (after the bias-corrected sqrt).
5. Theirs' other options are off: ``pre_norm=False`` (no global gradient-norm rescaling, so
   ``max_grad_norm`` is unused), ``rectify=False`` (RAdam; ``degenerated_to_sgd`` only matters
   with it), no ``adanorm``, ``grad_averaging=True`` (m gains (1 - beta1) * g, as ours);
   ``foreach=False`` picks their per-tensor code path (their batched path computes the same).
6. Step counter: theirs one int per group, ours one int per parameter; equal here because
   every parameter gets a gradient at every step.

Lars (ours) vs pytorch_optimizer.LARS (theirs):

1. What is adapted. Theirs decides by shape: tensors with ndim > 1 get the local learning rate
   and weight decay, 1-d tensors (biases, norm parameters) get neither, whatever their group
   says. Ours decides by the per-group ``trust_ratio`` flag, and a ``trust_ratio=False`` group
   still gets its weight decay. Configured: the trust groups hold matrices only and the
   ``trust_ratio=False`` group holds the 1-d tensors with ``weight_decay=0``.
2. eps. Ours has eps in the local-LR denominator, theirs none. The comparison runs ours with
   eps=0; ``test_lars_eps_and_weight_decay_formula`` checks the eps placement explicitly.
3. Degenerate norms. Ours uses local LR 1 when ||p|| or ||g|| is 0; theirs when ||p|| is 0 or
   ||g|| + wd * ||p|| is 0. They differ for g = 0, p != 0, wd > 0 (theirs: trust_coefficient /
   wd); ``test_lars_zero_weight_and_zero_grad`` checks ours with explicit values.
4. Theirs has ``dampening`` (0 here, as ours has none); it modifies ``p.grad`` in place (ours
   does not), so the two run on separate copies of the model. Defaults differ (lr 1e-3 vs
   0.1), so everything is passed explicitly. Neither clips the local LR; both apply lr outside
   the momentum buffer (the paper puts it inside; the same for a constant lr).
"""

import copy
import importlib.machinery
import importlib.util
import io
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "template" / "{{package_name}}"


def _load(name: str, filename: str):
    # The file name does not end in .py, so the loader has to be given explicitly.
    path = str(PACKAGE_DIR / filename)
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    # No bytecode next to the source: Copier would copy a __pycache__ into rendered projects.
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


Lamb = _load("template_lamb", "{% if optimizer == 'lamb' %}lamb.py{% endif %}").Lamb
Lars = _load("template_lars", "{% if optimizer == 'lars' %}lars.py{% endif %}").Lars

STEPS = 20
# float64 throughout; the reference comparisons match to rounding.
TOL = {"rtol": 1e-12, "atol": 1e-14}


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(6, 12, bias=False),  # a bias before BatchNorm would get no gradient
        nn.BatchNorm1d(12),
        nn.ReLU(),
        nn.Linear(12, 8),
        nn.Tanh(),
        nn.Linear(8, 3),
    ).double()


def make_batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(16, 6, generator=gen, dtype=torch.float64),
            torch.randn(16, 3, generator=gen, dtype=torch.float64),
        )
        for _ in range(n)
    ]


def lamb_groups(model: nn.Sequential) -> list[dict]:
    l1, bn, l2, l3 = model[0], model[1], model[3], model[5]
    return [
        {"params": [l1.weight], "lr": 2e-2, "weight_decay": 0.05},
        {"params": [l2.weight, l3.weight], "lr": 1e-2, "betas": (0.8, 0.99)},
        {
            "params": [bn.weight, bn.bias, l2.bias],
            "trust_ratio": False,
            "weight_decay": 0.0,
            "eps": 1e-2,
        },
        {"params": [l3.bias], "trust_ratio": False, "weight_decay": 0.1, "lr": 5e-3, "eps": 0.1},
    ]


def lars_groups(model: nn.Sequential) -> list[dict]:
    l1, bn, l2, l3 = model[0], model[1], model[3], model[5]
    return [
        {"params": [l1.weight], "weight_decay": 0.05},
        {"params": [l2.weight, l3.weight], "lr": 0.5, "trust_coefficient": 0.02},
        {
            "params": [bn.weight, bn.bias, l2.bias, l3.bias],
            "trust_ratio": False,
            "weight_decay": 0.0,
            "lr": 0.05,
        },
    ]


def mse_closure(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor):
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    return closure


def assert_same_params(a: nn.Module, b: nn.Module, **tol) -> None:
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert_close(pa, pb, msg=lambda m, name=name: f"{name}: {m}", **tol)


@pytest.mark.parametrize(
    "eps, tol",
    [
        (1e-12, TOL),  # theirs' eps in the trust ratio vanishes: exact to rounding
        (1e-6, {"rtol": 1e-7, "atol": 1e-8}),  # measured drift from that term: <= 3e-9
    ],
)
def test_lamb_matches_pytorch_optimizer_step_by_step(eps: float, tol: dict):
    po = pytest.importorskip("pytorch_optimizer")
    ours_model, ref_model = make_model(), make_model()
    specs = lamb_groups(ours_model)
    ours = Lamb(specs, lr=1e-3, eps=eps)
    ref_groups = []
    for spec, ref_spec in zip(specs, lamb_groups(ref_model), strict=True):
        spec = {**ours.defaults, **spec}
        ref_groups.append({**ref_spec, "adam": not spec.pop("trust_ratio")})
    ref = po.Lamb(
        ref_groups,
        lr=1e-3,
        eps=eps,
        weight_decouple=False,
        adam_debias=True,
        pre_norm=False,
        rectify=False,
        grad_averaging=True,
        foreach=False,
    )
    base = [{k: g[k] for k in ("lr", "eps", "weight_decay")} for g in ours.param_groups]

    for t, (x, y) in enumerate(make_batches(STEPS), start=1):
        before = [p.detach().clone() for p in ours_model.parameters()]
        loss = ours.step(mse_closure(ours_model, ours, x, y))

        for group, b in zip(ref.param_groups, base, strict=True):
            beta1, beta2 = group["betas"]
            bc1, bc2 = 1.0 - beta1**t, 1.0 - beta2**t
            group["eps"] = b["eps"] * math.sqrt(bc2)
            group["weight_decay"] = b["weight_decay"] * bc1 / math.sqrt(bc2)
            group["lr"] = b["lr"] * math.sqrt(bc2) / bc1 if group["adam"] else b["lr"]
        ref.zero_grad()
        ref_loss = nn.functional.mse_loss(ref_model(x), y)
        ref_loss.backward()
        ref.step()

        assert_close(loss, ref_loss, **tol)
        assert_same_params(ours_model, ref_model, **tol)
        for p in ref_model.parameters():
            assert torch.linalg.vector_norm(p) < ref.clamp  # theirs' clamp must not act
        for p, p0 in zip(ours_model.parameters(), before, strict=True):
            assert not torch.equal(p, p0)  # every group moves at every step


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_pytorch_optimizer_step_by_step(nesterov: bool):
    po = pytest.importorskip("pytorch_optimizer")
    ours_model, ref_model = make_model(), make_model()
    ours = Lars(lars_groups(ours_model), lr=0.2, momentum=0.9, eps=0.0, nesterov=nesterov)
    ref_groups = lars_groups(ref_model)
    for group in ref_groups:
        trust = group.pop("trust_ratio", True)
        # Theirs adapts exactly the >1-d tensors; the groups must line up with that.
        assert all((p.ndim > 1) == trust for p in group["params"])
    ref = po.LARS(
        ref_groups,
        lr=0.2,
        momentum=0.9,
        dampening=0.0,
        trust_coefficient=0.001,
        nesterov=nesterov,
        foreach=False,
    )

    for x, y in make_batches(STEPS):
        before = [p.detach().clone() for p in ours_model.parameters()]
        loss = ours.step(mse_closure(ours_model, ours, x, y))

        ref.zero_grad()
        ref_loss = nn.functional.mse_loss(ref_model(x), y)
        ref_loss.backward()
        ref.step()

        assert_close(loss, ref_loss, **TOL)
        assert_same_params(ours_model, ref_model, **TOL)
        for p, p0 in zip(ours_model.parameters(), before, strict=True):
            assert not torch.equal(p, p0)


def test_lars_eps_and_weight_decay_formula():
    """One step against the definition written out, with an eps large enough to matter."""
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    g = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    lr, wd, tc, eps, mom = 0.3, 0.1, 0.02, 0.5, 0.9
    p = nn.Parameter(w0.clone())
    opt = Lars([p], lr=lr, momentum=mom, weight_decay=wd, trust_coefficient=tc, eps=eps)
    for step in range(2):
        p.grad = g.clone()
        opt.step()
        assert torch.equal(p.grad, g)  # the gradient is not modified
        if step == 0:
            local = tc * w0.norm() / (g.norm() + wd * w0.norm() + eps)
            d1 = local * (g + wd * w0)
            assert_close(p.detach(), w0 - lr * d1, **TOL)
            w1 = p.detach().clone()
    local = tc * w1.norm() / (g.norm() + wd * w1.norm() + eps)
    d2 = local * (g + wd * w1)
    assert_close(p.detach(), w1 - lr * (mom * d1 + d2), **TOL)


def test_lamb_zero_weight_and_zero_grad():
    lr, eps = 0.1, 1e-6
    gen = torch.Generator().manual_seed(4)
    g = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    w = torch.randn(5, generator=gen, dtype=torch.float64)
    zero_weight = nn.Parameter(torch.zeros(4, 3, dtype=torch.float64))
    zero_grad = nn.Parameter(w.clone())
    zero_grad_decay = nn.Parameter(w.clone())
    both_zero = nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    opt = Lamb(
        [
            {"params": [zero_weight, zero_grad, both_zero]},
            {"params": [zero_grad_decay], "weight_decay": 0.01},
        ],
        lr=lr,
        eps=eps,
    )
    for step in range(5):
        zero_weight.grad = g.clone() if step == 0 else torch.zeros_like(g)
        for p in (zero_grad, zero_grad_decay, both_zero):
            p.grad = torch.zeros_like(p)
        opt.step()
        if step == 0:
            # ||p|| = 0: trust 1, a plain bias-corrected Adam step, g / (|g| + eps) at t=1.
            assert_close(zero_weight.detach(), -lr * g / (g.abs() + eps), **TOL)
            # Zero update (g = 0, wd = 0): trust 1 and nothing moves.
            assert torch.equal(zero_grad.detach(), w)
            # g = 0, wd > 0: update = wd * p, trust = 1 / wd, so p shrinks by (1 - lr).
            assert_close(zero_grad_decay.detach(), (1 - lr) * w, **TOL)
        for p in (zero_weight, zero_grad, zero_grad_decay, both_zero):
            assert torch.isfinite(p).all()
            assert all(torch.isfinite(s).all() for s in opt.state[p].values() if torch.is_tensor(s))
    assert torch.equal(both_zero.detach(), torch.zeros(2, 2, dtype=torch.float64))
    assert torch.equal(zero_grad.detach(), w)


def test_lars_zero_weight_and_zero_grad():
    lr, wd = 0.1, 0.01
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    w = torch.randn(5, 2, generator=gen, dtype=torch.float64)
    zero_weight = nn.Parameter(torch.zeros(4, 3, dtype=torch.float64))
    zero_grad = nn.Parameter(w.clone())
    zero_grad_decay = nn.Parameter(w.clone())
    both_zero = nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    opt = Lars(
        [
            {"params": [zero_weight, zero_grad, both_zero]},
            {"params": [zero_grad_decay], "weight_decay": wd},
        ],
        lr=lr,
        momentum=0.0,
    )
    zero_weight.grad = g.clone()
    for p in (zero_grad, zero_grad_decay, both_zero):
        p.grad = torch.zeros_like(p)
    opt.step()
    # ||p|| = 0: local LR 1, a plain SGD step.
    assert_close(zero_weight.detach(), -lr * g, **TOL)
    # ||g|| = 0: local LR 1, so only the decay term acts.
    assert torch.equal(zero_grad.detach(), w)
    assert_close(zero_grad_decay.detach(), w - lr * wd * w, **TOL)
    assert torch.equal(both_zero.detach(), torch.zeros(2, 2, dtype=torch.float64))
    for p in (zero_weight, zero_grad, zero_grad_decay, both_zero):
        assert torch.isfinite(p).all()


OPTIMIZERS = {
    "lamb": (Lamb, lamb_groups, {"lr": 1e-2, "weight_decay": 0.01}),
    "lars": (Lars, lars_groups, {"lr": 0.5, "weight_decay": 1e-3, "nesterov": True}),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_dict_round_trip_resumes_identically(name: str):
    cls, groups, kwargs = OPTIMIZERS[name]
    batches = make_batches(10, seed=7)
    model = make_model()
    opt = cls(groups(model), **kwargs)
    for x, y in batches[:5]:
        opt.step(mse_closure(model, opt, x, y))

    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)

    resumed_model = copy.deepcopy(model)
    resumed = cls(groups(resumed_model), **kwargs)
    resumed.load_state_dict(loaded)
    fresh_model = copy.deepcopy(model)
    fresh = cls(groups(fresh_model), **kwargs)
    for x, y in batches[5:]:
        opt.step(mse_closure(model, opt, x, y))
        resumed.step(mse_closure(resumed_model, resumed, x, y))
        fresh.step(mse_closure(fresh_model, fresh, x, y))

    for p, q in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(p, q)
    # The state matters: without it the run goes elsewhere.
    assert any(
        not torch.equal(p, q)
        for p, q in zip(model.parameters(), fresh_model.parameters(), strict=True)
    )


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_reduces_loss_on_regression(name: str):
    cls, _, _ = OPTIMIZERS[name]
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(256, 10, generator=gen)
    y = torch.sin(x @ torch.randn(10, 1, generator=gen)) + 0.5 * x[:, :1]
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    weights = [p for p in model.parameters() if p.ndim > 1]
    others = [p for p in model.parameters() if p.ndim <= 1]
    if cls is Lamb:
        opt = cls(
            [{"params": weights}, {"params": others, "trust_ratio": False, "weight_decay": 0.0}],
            lr=3e-2,
            weight_decay=1e-3,
        )
    else:
        opt = cls(
            [
                {"params": weights},
                {"params": others, "trust_ratio": False, "weight_decay": 0.0, "lr": 0.05},
            ],
            lr=5.0,
            weight_decay=1e-4,
        )
    closure = mse_closure(model, opt, x, y)
    first = closure().item()
    for _ in range(200):
        opt.step(closure)
    final = closure().item()
    assert final < 0.2 * first, (first, final)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_momentum_is_cyclable_by_schedulers(name: str):
    cls, groups, kwargs = OPTIMIZERS[name]
    model = make_model()
    opt = cls(groups(model), **kwargs)
    key = "betas" if cls is Lamb else "momentum"
    assert key in opt.defaults
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    start = [g[key] for g in opt.param_groups]
    x, y = make_batches(1)[0]
    for _ in range(3):
        opt.step(mse_closure(model, opt, x, y))
        sched.step()
    assert [g[key] for g in opt.param_groups] != start


def _all_kinds_of_groups(device: str) -> tuple[list[nn.Parameter], list[dict], list[dict]]:
    params = [nn.Parameter(torch.randn(4, 3, device=device)) for _ in range(4)]
    for p in params:
        p.grad = torch.randn_like(p)
    lamb = [
        {"params": params[:2], "weight_decay": 0.1},
        {"params": params[2:], "trust_ratio": False},
    ]
    lars = [
        {"params": params[:2], "weight_decay": 0.1, "nesterov": True},
        {"params": params[2:], "trust_ratio": False},
    ]
    return params, lamb, lars


def test_step_needs_no_host_sync():
    """Meta tensors have no values: any .item()/bool()/float() on them raises."""
    _, lamb, lars = _all_kinds_of_groups("meta")
    for opt in (Lamb(lamb, lr=1e-2), Lars(lars, lr=0.1)):
        opt.step()
        opt.step()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_needs_no_cuda_sync():
    _, lamb, lars = _all_kinds_of_groups("cuda")
    opts = (Lamb(lamb, lr=1e-2), Lars(lars, lr=0.1))
    for opt in opts:
        opt.step()  # first step allocates state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for opt in opts:
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
