"""Loop overhead: the rendered train.py's training loop against a bare hand-written loop.

    python bench/loop_overhead.py [--quick] [--repeats N] [--device cuda] [--project DIR]

The template is rendered with its default answers (SGD, warmup + cosine) and trained in
float32 (`--amp off`) with `--workers 0` on the CPU (or the GPU, with `--device cuda`) on:

  - a tiny MLP on 8x8 images: a step costs little, so the per-step overhead dominates;
  - the built-in ResNet on 32x32 images: a step costs a lot of arithmetic.

How it is made fair:
  - Both loops run in this one process, side by side: train.py's main() runs as a user
    would run it, and next to each of its epochs the bare loop (bench/bare_loop.py) trains
    one epoch of its own, before it on odd epochs and after it on even ones. Each epoch
    gives one pair, seconds apart, so a machine whose speed drifts (a shared VM) favours
    neither; the first epoch of the run is a warm-up and is left out. The table shows the
    median ratio over the pairs and its min-max range.
  - Same data: the bare loop builds its data set, loader and sampler with the rendered
    package's own build_dataset/build_loaders from the same flags, and its model,
    optimizer and schedule with the package's build_model/build_optimizer/build_scheduler.
    Same seed, batch, precision (float32), torch threads and number of steps. The bare
    loop normalises the uint8 batches on the device like the rendered one.
  - Same clock: a rendered epoch is one call of train.py's train_one_epoch, timed from the
    call until the device has finished; the bare loop starts its clock before its first
    batch and stops it after `loss.item()`. Evaluation and checkpoints between epochs are
    outside both clocks.
  - The data come either from the on-device path (`--data-on-device on`; on a CPU the set
    stays in memory and whole batches are shuffled and augmented there), which leaves the
    loop itself as the only difference, or from the DataLoader path with 0 workers, where
    per-sample augmentation in the loading process also counts.
  - train.py runs with no terminal (as in a batch job), so its tqdm bar is off; what the bar
    costs in a terminal is measured separately by the breakdown (bench/overhead_breakdown.py).

The ratio is rendered / bare throughput: 1.00 means no overhead, 0.97 means the rendered
loop trains 3 % fewer samples per second. Target: >= 0.97 on both workloads.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_loop  # noqa: E402
import common  # noqa: E402

TARGET = 0.97
# float32 on both sides (the bare loop has no autocast); --device is added per run
BASE = ["--workers", "0", "--batch-size", "128", "--seed", "0", "--amp", "off"]


def workloads(quick: bool) -> list[tuple[str, str, list[str], int]]:
    """(key, label, flags, pairs) per row: one pair per epoch after the first."""
    mlp = ["--model", "mlp", "--image-size", "8"]
    if quick:
        return [
            ("mlp", "mlp 8x8, data on device",
             [*mlp, "--data-on-device", "on", "--synthetic-size", "2048"], 3),
            ("resnet", "resnet_small 32x32, data on device",
             ["--model", "resnet_small", "--data-on-device", "on", "--synthetic-size", "256"], 1),
        ]  # fmt: skip
    return [
        ("mlp", "mlp 8x8, data on device (overhead-dominated)",
         [*mlp, "--data-on-device", "on", "--synthetic-size", "5120"], 60),
        ("mlp-loader", "mlp 8x8, DataLoader with 0 workers",
         [*mlp, "--data-on-device", "off", "--synthetic-size", "2048"], 30),
        ("resnet", "resnet_small 32x32, data on device (compute-dominated)",
         ["--model", "resnet_small", "--data-on-device", "on", "--synthetic-size", "1280"], 8),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> str:
    options = common.parser(__doc__).parse_args(argv)
    rows, verdict_ratios = [], {}
    with common.workdir(options.keep) as work:
        common.log("loop overhead: preparing the default project")
        project = common.default_project(options, work)
        try:
            for key, label, flags, pairs in workloads(options.quick):
                pairs = options.repeats or pairs
                flags = [*BASE, "--device", options.device, *flags, "--epochs", str(pairs + 1)]
                measured = bare_loop.paired_epochs(project, flags, work / "runs" / key)
                common.log(
                    f"  {label}: rendered / bare by epoch "
                    + " ".join(f"{r / b:.3f}" for r, b in measured)
                )
                row, verdict_ratios[key] = common.pair_row(label, measured)
                rows.append(row)
        finally:
            project.close()
    header = ["workload", "rendered samples/s", "bare samples/s", "rendered / bare", "pairs"]
    met = all(verdict_ratios[k] >= TARGET for k in ("mlp", "resnet"))
    summary = ", ".join(f"{k} {v:.3f}" for k, v in verdict_ratios.items())
    text = "\n\n".join(
        [
            "### Loop overhead: rendered train.py vs a bare loop",
            "Median ratio of throughputs over interleaved pairs (min–max in brackets); "
            "samples/s are medians, for context only.",
            common.table(header, rows),
            common.verdict(
                met, f"target rendered / bare >= {TARGET} on the MLP and the ResNet ({summary})"
            ),
        ]
    )
    return text


if __name__ == "__main__":
    print(main())
