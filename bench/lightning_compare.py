"""Against Lightning: the rendered train.py and Lightning's Trainer on the same tiny workload.

    python bench/lightning_compare.py [--quick] [--repeats N] [--device cuda] [--project DIR]

The template is rendered with its default answers and both train the tiny MLP on 8x8
synthetic images (batch 128, float32, 0 loader workers, on the CPU unless --device says
otherwise), where the per-step cost of the training machinery shows most.

How it is made fair:
  - Same everything but the loop: the LightningModule wraps the model made by the rendered
    package's build_model, its configure_optimizers returns the package's own optimizer
    and schedule (stepped every optimizer step, as train.py does), and the Trainer gets
    the training set object that the package's build_loaders made from the same flags
    (the on-device set, or its DataLoader with 0 workers). Batches are normalised by the
    package's DeviceBatches in training_step, as train.py does in its loop.
  - Lightning is set up the way a user would for speed: no logger, no checkpointing, no
    progress bar, no model summary, no sanity validation, "32-true" precision.
    train.py runs without a terminal, so its progress bar is off too, and its evaluation
    and checkpoints between epochs fall outside its clock.
  - Same clock: train.py's own samples_per_s (one train_one_epoch call); for Lightning a
    callback times on_train_epoch_start -> on_train_epoch_end. Each run trains four
    epochs and the first is left out as warm-up, for both; a run's speed is the harmonic
    mean of the other three.
  - Both run in this one process, alternately (A B, B A, ...), with the same torch threads;
    each pair gives one ratio, and the table shows their median and min-max range.

The ratio is rendered / Lightning throughput: above 1.00 the rendered loop is faster.
Target: faster than Lightning (ratio > 1).
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

# float32 on both sides (Lightning's "32-true"); --device is added per run
BASE = ["--workers", "0", "--batch-size", "128", "--seed", "0", "--amp", "off"]
MLP = ["--model", "mlp", "--image-size", "8"]


def workloads(quick: bool) -> list[tuple[str, list[str]]]:
    size, loader_size, epochs = ("4096", "2048", "2") if quick else ("60000", "4096", "4")
    return [
        ("mlp 8x8, data on device",
         [*MLP, "--data-on-device", "on", "--synthetic-size", size, "--epochs", epochs]),
        ("mlp 8x8, DataLoader with 0 workers",
         [*MLP, "--data-on-device", "off", "--synthetic-size", loader_size, "--epochs", epochs]),
    ]  # fmt: skip


def lightning_run(project: common.Project, args) -> list[float]:
    """Train with Lightning's Trainer; return each epoch's samples/s."""
    import lightning as L
    import torch.nn.functional as F

    data, utils = project.data, project.utils
    device = utils.pick_device(args.device)
    utils.seed_everything(args.seed, args.deterministic)
    train_set, val_set, info = data.build_dataset(args)
    loader, _, sampler = data.build_loaders(train_set, val_set, info, args, device)
    model = project.models.build_model(args.model, info)
    batches = data.DeviceBatches(loader, info, device, args.channels_last)
    steps_per_epoch = len(loader)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            images, targets = batches.prepare(*batch)
            logits = self.model(images)
            return F.cross_entropy(logits, targets, label_smoothing=args.label_smoothing)

        def configure_optimizers(self):
            optimizer = project.optim.build_optimizer(self.model, args, device)
            scheduler = project.schedule.build_scheduler(
                optimizer, args, args.epochs, steps_per_epoch
            )
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }

    class Clock(L.Callback):
        def __init__(self) -> None:
            self.speeds: list[float] = []

        def on_train_epoch_start(self, trainer, module) -> None:
            sampler.set_epoch(trainer.current_epoch)  # as train.py does, outside the clock
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer, module) -> None:
            seconds = time.perf_counter() - self.start
            self.speeds.append(steps_per_epoch * args.batch_size / seconds)

    clock = Clock()
    with common.silenced(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            accelerator=device.type,
            devices=1,
            max_epochs=args.epochs,
            precision="32-true",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[clock],
        )
        trainer.fit(Module(), train_dataloaders=loader)
    return clock.speeds


def main(argv: list[str] | None = None) -> str:
    options = common.parser(__doc__).parse_args(argv)
    # The DataLoader row is data-bound: the loops differ by a few per cent of its step, less
    # than single pairs swing on a shared machine, so it takes many pairs.
    repeats = options.repeats or (1 if options.quick else 11)
    import lightning  # its import sets its loggers' levels, so quieten them after it

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    rows, medians = [], []
    with common.workdir(options.keep) as work:
        common.log("lightning: preparing the default project")
        project = common.default_project(options, work)
        try:
            for n, (label, flags) in enumerate(workloads(options.quick)):
                flags = [*BASE, "--device", options.device, *flags]
                out = ["--out-dir", str(work / "runs" / str(n))]

                def rendered(flags=flags, out=out) -> float:
                    rows = project.main(*flags, *out)
                    return statistics.harmonic_mean([r["samples_per_s"] for r in rows][1:])

                def with_lightning(flags=flags) -> float:
                    speeds = lightning_run(project, project.args(*flags))
                    return statistics.harmonic_mean(speeds[1:])

                pairs = common.interleave(rendered, with_lightning, repeats, label)
                row, median = common.pair_row(label, pairs)
                rows.append(row)
                medians.append(median)
        finally:
            project.close()
    header = ["workload", "rendered samples/s", "Lightning samples/s", "rendered / Lightning"]
    summary = ", ".join(f"{m:.3f}" for m in medians)
    return "\n\n".join(
        [
            f"### Against Lightning {lightning.__version__}: rendered train.py vs Trainer",
            "Median ratio of throughputs over interleaved pairs (min–max in brackets); "
            "samples/s are medians, for context only.",
            common.table([*header, "pairs"], rows),
            common.verdict(
                all(m > 1 for m in medians),
                f"target rendered / Lightning > 1 on every row ({summary})",
            ),
        ]
    )


if __name__ == "__main__":
    print(main())
