"""Every optimizer with every schedule, at the defaults the answers give, learns an easy
problem: the loss falls well below its starting value.

Each pair is rendered (amp=off) and its own `build_optimizer` and `build_scheduler` are used,
with the arguments its own parser gives by default (the optimizer's default learning rate from
copier.yml included), only `--epochs` shortened. A 2-layer MLP (weight matrices in the decayed
parameter group, biases in the other) is trained on Gaussian blobs, with the optimizer and the
schedule stepped as train.py steps them: one scheduler step per optimizer step.

At the margin used, every pair ends below 0.2 x its starting loss (the slowest: the adaptive
optimizers with the step schedule, whose decays by 10 at a third and two thirds of the run
leave few steps at the peak); a learning rate of 0, or a schedule stuck at 0, stays at 1 x.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import OPTIMIZERS, SCHEDULERS, inside, render

EPOCHS, STEPS_PER_EPOCH, BATCH = 5, 20, 64
CLASSES, FEATURES, HIDDEN = 4, 16, 64
MARGIN = 0.3  # final loss < MARGIN x initial loss


@functools.cache
def blobs() -> tuple[torch.Tensor, torch.Tensor]:
    """One Gaussian blob per class, unit noise around centres about 2 x sqrt(16) apart."""
    gen = torch.Generator().manual_seed(0)
    centres = 2 * torch.randn(CLASSES, FEATURES, generator=gen)
    labels = torch.randint(CLASSES, (STEPS_PER_EPOCH * BATCH,), generator=gen)
    points = centres[labels] + torch.randn(len(labels), FEATURES, generator=gen)
    return points, labels


def train_pair(project, flags: list[str]) -> list[float]:
    """Train with the project's optimizer and schedule; return the loss over the whole set
    before training and after each epoch."""
    points, labels = blobs()
    with inside(project):
        import train as project_train
        from proj.optim import build_optimizer
        from proj.schedule import build_scheduler

        args = project_train.get_args_parser().parse_args(["--epochs", str(EPOCHS), *flags])
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
        optimizer = build_optimizer(model, args, torch.device("cpu"))
        scheduler = build_scheduler(optimizer, args, args.epochs, STEPS_PER_EPOCH)

    assert [len(group["params"]) for group in optimizer.param_groups] == [2, 2]

    def full_loss() -> float:
        with torch.no_grad():
            return F.cross_entropy(model(points), labels).item()

    losses = [full_loss()]
    gen = torch.Generator().manual_seed(1)
    for _ in range(args.epochs):
        order = torch.randperm(len(labels), generator=gen).view(STEPS_PER_EPOCH, BATCH)
        for batch in order:
            F.cross_entropy(model(points[batch]), labels[batch]).backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(full_loss())
    return losses


@pytest.mark.parametrize(
    ("optimizer", "scheduler"), list(itertools.product(OPTIMIZERS, SCHEDULERS))
)
def test_every_pair_learns(template, tmp_path, optimizer, scheduler):
    project = render(template, tmp_path / "p", amp="off", optimizer=optimizer, scheduler=scheduler)
    losses = train_pair(project, [])
    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < MARGIN * losses[0], [round(loss, 4) for loss in losses]


@pytest.mark.parametrize(
    ("optimizer", "scheduler", "flags"),
    [
        ("sgd", "constant", ["--lr", "1e-9"]),  # a learning rate that moves nothing
        # a schedule that drops to ~0 after one step at a modest peak: x 1e-9 every step
        (
            "adam",
            "step",
            ["--lr", "0.002", "--warmup-steps", "0", "--step-epochs", "0.05", "--gamma", "1e-9"],
        ),
    ],
    ids=["lr-zero", "schedule-zero"],
)
def test_the_margin_fails_training_that_does_not_learn(
    template, tmp_path, optimizer, scheduler, flags
):
    """The same check on a run whose updates are ~0 (after at most one step at the peak): the
    loss stays near where it started, far above the margin."""
    project = render(template, tmp_path / "p", amp="off", optimizer=optimizer, scheduler=scheduler)
    losses = train_pair(project, flags)
    assert losses[-1] > 0.8 * losses[0] > MARGIN * losses[0], losses
