"""fp16's GradScaler in the training step, checked by what reaches the optimizer: gradients
are unscaled before they are clipped, and the schedule advances only with steps that the
scaler really took. The rendered train.py runs in this process with `--amp fp16` on the CPU."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from tests.helpers import inside, render

FLAGS = ["--device", "cpu", "--amp", "fp16", "--model", "mlp", "--image-size", "8"]
FLAGS += ["--workers", "0", "--batch-size", "16", "--epochs", "1"]


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("amp") / "p", amp="fp16", optimizer="adamw")


@pytest.fixture(scope="module")
def sgd_project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("amp-sgd") / "p", amp="fp16")


def train_main(project, flags) -> None:
    with inside(project):
        import train

        train.main(flags)


@pytest.mark.parametrize("clip", [1e-3, 0.05])
def test_gradients_are_unscaled_before_they_are_clipped(sgd_project, tmp_path, clip):
    """Plain SGD (no momentum, no weight decay) moves the weights by lr x gradient, so each
    step's move over its lr is the norm of the gradient it applied: the clipping threshold,
    as the raw gradients are larger. Clipping the scaled gradients would leave them `scale`
    times too small (whether the optimizer or the scaler unscales them afterwards)."""
    applied, before = [], {}

    def params(optimizer):
        return [p for group in optimizer.param_groups for p in group["params"]]

    def pre(optimizer, args, kwargs):
        before["weights"] = [p.detach().clone() for p in params(optimizer)]
        before["lr"] = optimizer.param_groups[0]["lr"]

    def post(optimizer, args, kwargs):
        moves = [p.detach() - w for p, w in zip(params(optimizer), before["weights"], strict=True)]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m) for m in moves]))
        if norm > 0:  # 0: a step the scaler skipped (overflowing fp16 gradients)
            applied.append(norm.item() / before["lr"])

    hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        flags = [*FLAGS, "--synthetic-size", "160", "--clip-grad", str(clip), "--lr", "1"]
        flags += ["--momentum", "0", "--weight-decay", "0", "--out-dir", str(tmp_path)]
        train_main(sgd_project, flags)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(applied) >= 5, applied
    assert applied == pytest.approx([clip] * len(applied), rel=2e-2)


def test_the_schedule_waits_for_steps_the_scaler_skipped(project, tmp_path, monkeypatch):
    """A scaler that starts far too high overflows the fp16 gradients for its first steps and
    skips them; the schedule counts only the steps the optimizer took."""
    monkeypatch.setattr(
        torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0**28)
    )
    flags = [*FLAGS, "--synthetic-size", "320", "--out-dir", str(tmp_path)]
    train_main(project, flags)
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    loop_steps = state["progress"]["step"]
    taken = int(state["optimizer"]["state"][0]["step"])  # AdamW counts the steps it takes
    assert 0 < taken < loop_steps, (taken, loop_steps)  # some were skipped, not all
    assert state["scheduler"]["last_epoch"] == taken
    assert state["scaler"]["scale"] < 2.0**28
