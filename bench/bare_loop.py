"""The bare training loop that the rendered train.py is measured against.

What a careful engineer would write by hand in a few lines: forward, loss, backward,
optimizer step, schedule step, zero the gradients. No mixed-precision context, no guard
against non-finite losses, no running meters, no progress bar, no checkpoint or signal
checks. Everything else is taken from the rendered project itself (data set, loader,
sampler, model, optimizer, schedule, seeding), so that only the loop differs.

`paired_epochs` runs a rendered train.py and this loop side by side, one epoch each in
turn, in one process: the pairs are seconds apart, so that a machine whose speed drifts
(a shared VM) favours neither loop.
"""

from __future__ import annotations

import time
from pathlib import Path

import common
import torch
import torch.nn.functional as F


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BareLoop:
    """Trains as the rendered train.py would with these parsed flags (single process, CPU
    or one GPU, no accumulation), one epoch per call."""

    def __init__(self, project, args) -> None:
        data, utils = project.data, project.utils
        self.device = device = utils.pick_device(args.device)
        utils.seed_everything(args.seed, args.deterministic)
        train_set, val_set, info = data.build_dataset(args)
        self.loader, _, self.sampler = data.build_loaders(train_set, val_set, info, args, device)
        model = project.models.build_model(args.model, info)
        self.model = model.to(device)
        self.optimizer = project.optim.build_optimizer(model, args, device)
        self.scheduler = project.schedule.build_scheduler(
            self.optimizer, args, args.epochs, len(self.loader)
        )
        self.mean = torch.tensor(info.mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(info.std, device=device).view(1, -1, 1, 1)
        self.label_smoothing = args.label_smoothing

    def epoch(self, epoch: int) -> float:
        """One epoch; its samples/s, timed like train.py's metrics.csv: from just before the
        first batch is asked for until the device has finished the last step."""
        device, model, optimizer = self.device, self.model, self.optimizer
        self.sampler.set_epoch(epoch)
        model.train()
        seen = 0
        start = time.perf_counter()
        for images, targets in self.loader:
            images = (images.to(device, non_blocking=True).float() - self.mean) / self.std
            targets = targets.to(device, non_blocking=True)
            loss = F.cross_entropy(model(images), targets, label_smoothing=self.label_smoothing)
            loss.backward()
            optimizer.step()
            self.scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            seen += targets.numel()
        loss.item()  # the host waits for the device once, as the rendered loop does
        return seen / (time.perf_counter() - start)


def paired_epochs(
    project, flags: list[str], out_dir: Path, module=None
) -> list[tuple[float, float]]:
    """Run a rendered train.py's main() (`module`, the project's own train.py by default)
    with these flags, and next to each of its epochs one epoch of the bare loop built from
    the same flags: the bare one first on odd epochs, second on even ones, so that the
    measured pairs (all but the first, a warm-up) start with the bare loop first.

    Returns (rendered samples/s, bare samples/s) per epoch, the first (warm-up) left out.
    Each rendered epoch is one train_one_epoch call, with the checks it makes between steps,
    timed from its start until the device has finished; evaluation and checkpoints between
    epochs are outside both clocks."""
    module = module or project.train
    args = project.args(*flags)
    bare = BareLoop(project, args)
    inner = module.train_one_epoch
    pairs = []

    def train_one_epoch(parts, run, *rest):
        """The rendered epoch, timed, beside one epoch of the bare loop."""
        epoch = len(pairs)
        if epoch % 2 == 1:
            b = bare.epoch(epoch)
        samples = len(run.batches) * args.batch_size
        start = time.perf_counter()
        inner(parts, run, *rest)
        synchronize(bare.device)
        r = samples / (time.perf_counter() - start)
        if epoch % 2 == 0:
            b = bare.epoch(epoch)
        pairs.append((r, b))

    module.train_one_epoch = train_one_epoch
    try:
        with project.cwd(), common.silenced():
            module.main([*flags, "--out-dir", str(out_dir), "--fresh"])
    finally:
        module.train_one_epoch = inner
    return pairs[1:]
