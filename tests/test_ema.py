"""The EMA of the weights against an average computed by hand: after update u the average
is d * average + (1 - d) * weights, with d = min(decay, (1 + u) / (10 + u)), and buffers
(BatchNorm statistics) are copies of the model's."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from tests.helpers import TINY_RUN, inside, read_metrics, render, train


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("ema") / "p", extras=["ema"])


@pytest.fixture(scope="module")
def ema_class(project):
    with inside(project):
        yield importlib.import_module("proj.ema").EMA


@pytest.mark.parametrize("decay", [0.5, 0.9])
def test_the_average_is_the_hand_computed_one(ema_class, decay):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    ema = ema_class(model, decay)
    expected = {name: p.detach().clone().double() for name, p in model.named_parameters()}
    for u in range(1, 16):  # the ramp rules the first steps, then `decay` (for 0.5: from 8)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model.train()(torch.randn(8, 3))  # new BatchNorm statistics
        ema.update(model)
        d = min(decay, (1 + u) / (10 + u))
        for name, p in model.named_parameters():
            expected[name] = d * expected[name] + (1 - d) * p.detach().double()
        averaged = dict(ema.module.named_parameters())
        for name, value in expected.items():
            torch.testing.assert_close(averaged[name].double(), value, rtol=1e-5, atol=1e-6)
        for mine, theirs in zip(ema.module.buffers(), model.buffers(), strict=True):
            assert torch.equal(mine, theirs)
    assert ema.state_dict()["updates"] == 15


def test_the_average_resumes_where_it_was(ema_class):
    """A state dict carries the average and the number of updates (which sets the ramp)."""
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    ema = ema_class(model, 0.9)
    for _ in range(3):
        with torch.no_grad():
            model.weight.add_(1.0)
        ema.update(model)
    restored = ema_class(torch.nn.Linear(3, 2), 0.9)
    restored.load_state_dict(ema.state_dict())
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    restored.update(model)
    assert torch.equal(restored.module.weight, ema.module.weight)


def test_eval_only_reports_the_average_beside_the_weights(project, tmp_path, capsys):
    """--eval-only of a checkpoint reports its weights' and its average's validation metrics,
    the numbers its run logged for that epoch (the average's chose best.pt)."""
    flags = [*TINY_RUN, "--model", "mlp", "--ema-decay", "0.5", "--out-dir", str(tmp_path)]
    train(project, *flags, "--epochs", "1")
    logged = read_metrics(tmp_path)[-1]
    assert logged["ema_val_loss"] != logged["val_loss"]
    capsys.readouterr()
    train(project, *flags, "--eval-only")
    shown = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert shown[-1] == f"({tmp_path / 'last.pt'})"
    values = dict(zip(shown[:-1:2], map(float, shown[1:-1:2]), strict=True))
    assert values.keys() == {"val_loss", "val_acc", "ema_val_loss", "ema_val_acc"}
    for name, value in values.items():
        assert value == pytest.approx(logged[name], abs=1e-6), name


def test_the_run_averages_the_weights_each_step_leaves(project, tmp_path):
    """In the loop: after each optimizer step the average takes the weights that step left,
    from the weights the run began with; last.pt holds it, to rounding."""
    seen = []  # the weights before the first step, then after each step

    def record(optimizer, args, kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        seen.append([p.detach().clone().double() for p in params])

    first = register_optimizer_step_pre_hook(lambda *a: None if seen else record(*a))
    after = register_optimizer_step_post_hook(record)
    try:
        flags = [*TINY_RUN, "--model", "mlp", "--image-size", "8", "--ema-decay", "0.8"]
        train(project, *flags, "--out-dir", str(tmp_path))
    finally:
        first.remove()
        after.remove()
    average = seen[0]
    for u, weights in enumerate(seen[1:], start=1):
        d = min(0.8, (1 + u) / (10 + u))
        average = [d * a + (1 - d) * w for a, w in zip(average, weights, strict=True)]
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["ema"]["updates"] == len(seen) - 1 == 12  # 96 items in batches of 16, twice
    by_shape = {tuple(v.shape): v.double() for v in state["ema"]["module"].values()}
    assert len(by_shape) == len(average) == 4  # the MLP's weights and biases, by their shapes
    for expected in average:
        torch.testing.assert_close(by_shape[tuple(expected.shape)], expected, rtol=1e-5, atol=1e-6)
