"""The bare training loop that the rendered train.py is measured against.

What a careful engineer would write by hand in a few lines: forward, loss, backward,
optimizer step, schedule step, zero the gradients. No mixed-precision context, no guard
against non-finite losses, no running meters, no progress bar, no checkpoint or signal
checks. Everything else is taken from the rendered project itself (data set, loader,
sampler, model, optimizer, schedule, seeding), so that only the loop differs.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


def train(project, args) -> list[float]:
    """Train as the rendered train.py would with these parsed flags (single process, CPU or
    one GPU, no accumulation); return each epoch's samples/s, timed like its metrics.csv:
    from just before the epoch's first batch is asked for until the device has finished
    the epoch's last step."""
    data, utils = project.data, project.utils
    device = utils.pick_device(args.device)
    utils.seed_everything(args.seed, args.deterministic)
    train_set, val_set, info = data.build_dataset(args)
    workers = min(args.workers, utils.cpu_count())
    loader, _, sampler = data.build_loaders(train_set, val_set, info, args, workers, device)
    model = project.models.build_model(args.model, info.num_classes, info.channels, info.image_size)
    model.to(device)
    optimizer = project.optim.build_optimizer(model, args, device)
    scheduler = project.schedule.build_scheduler(optimizer, args, len(loader))
    mean = torch.tensor(info.mean, device=device).view(1, -1, 1, 1) * 255
    std = torch.tensor(info.std, device=device).view(1, -1, 1, 1) * 255

    speeds = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        seen = 0
        start = time.perf_counter()
        for images, targets in loader:
            images = (images.to(device, non_blocking=True).float() - mean) / std
            targets = targets.to(device, non_blocking=True)
            loss = F.cross_entropy(model(images), targets, label_smoothing=args.label_smoothing)
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            seen += targets.numel()
        loss.item()  # the host waits for the device once, as the rendered loop does
        speeds.append(seen / (time.perf_counter() - start))
    return speeds
