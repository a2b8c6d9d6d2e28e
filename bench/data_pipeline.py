"""Data pipeline: samples/s through the rendered project's own data path, no model.

    python bench/data_pipeline.py [--quick] [--repeats N]

Two sources, each loaded by the rendered package's build_dataset and build_loaders from
train.py's own parsed flags and then through its DeviceBatches (copy to the device,
normalise), exactly as train_one_epoch receives them; the consumer does nothing else:

  - an image folder of JPEGs written here (64x64, 10 classes; `--data imagefolder
    --image-size 32`: decode, resize, random crop with padding, flip, per-sample seeding);
  - the built-in synthetic set held in memory (32x32: random crop with padding, flip),
    also through the on-device path (`--data-on-device on`: whole batches shuffled and
    augmented where the model is; on a CPU that is main memory). It applies to in-memory
    sets only (synthetic, CIFAR, MNIST), not to image folders.

Loader settings: 0, 1 and 2 worker processes (capped by the CPUs available, as train.py
does), and, on CUDA, pinned memory on (what build_loaders chooses there) and off. Pinning
needs CUDA; on a machine without it those rows say n/a.

A third source is the issue's own task, in a project rendered with `data: tensors`: 4,000
float inputs of shape (1, 40) in a TensorDataset, 10 classes, batches of 128, and a user's
three-layer Conv1d network. Its data time per epoch (the second of two, through
build_loaders and DeviceBatches, the consumer doing nothing) is set against the model's
compute per epoch (forward, backward and an AdamW step on the same batches, ready in
memory): the whole-batch path that a TensorDataset takes, and the per-item loader that
any other data set takes (a wrapper that hides the tensors), with 0 workers and with the
recipe's 4 capped by the CPUs. The model runs on one torch thread, for steady figures on a
shared machine. Target: data time under 5 % of compute on the whole-batch
path.

Each configuration loads two epochs and the second is timed (workers are persistent, so
their start-up falls in the first). Every repeat measures all configurations, in an order
rotated from one repeat to the next; the ratio is a configuration's samples/s over the
same repeat's 0-worker samples/s for the same source, reported as the median and min-max
over repeats. Above 1.00 a configuration loads faster than the 0-worker baseline.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def write_jpegs(root: Path, train: int, val: int, size: int = 64) -> None:
    """`root/{train,val}/<class>/*.jpg`: smooth random colour patterns with noise."""
    import torch
    import torch.nn.functional as F
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    patterns = F.interpolate(torch.rand(10, 3, 4, 4, generator=gen), size=size, mode="bilinear")
    for split, count in (("train", train), ("val", val)):
        for n in range(count):
            label = n % 10
            image = patterns[label] + 0.15 * torch.randn(3, size, size, generator=gen)
            array = image.clamp(0, 1).mul(255).byte().permute(1, 2, 0).numpy()
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(array).save(folder / f"{n:05d}.jpg", quality=90)


def measure(project: common.Project, flags: list[str], pin: bool) -> float:
    """samples/s of the second of two epochs through build_loaders + DeviceBatches."""
    import torch

    data, utils = project.data, project.utils
    args = project.args(*flags)
    device = utils.pick_device(args.device)
    train_set, val_set, info = data.build_dataset(args)
    loader, _, sampler = data.build_loaders(train_set, val_set, info, args, device)
    if not pin and hasattr(loader, "pin_memory"):
        loader.pin_memory = False
    batches = data.DeviceBatches(loader, info, device, args.channels_last)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = 0
        start = time.perf_counter()
        for _images, targets in batches:
            seen += targets.numel()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the last batch has reached the device
        seconds = time.perf_counter() - start
    del batches, loader  # ends persistent workers
    return seen / seconds


def conv1d_net(channels: int = 1, num_classes: int = 10):
    """A user's small model for the 4,000 x 40 task: three Conv1d layers of 16 channels,
    pooled, one linear layer (the smaller the model, the more the data path weighs)."""
    import torch.nn as nn

    layers, width = [], channels
    for out in (16, 16, 16):
        layers += [nn.Conv1d(width, out, 5, padding=2), nn.BatchNorm1d(out), nn.ReLU()]
        width = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, num_classes))


def tensors_epoch(project: common.Project, train_set, flags: list[str]) -> tuple[float, list]:
    """Seconds of the second of two epochs of data alone, and that epoch's batches."""
    import torch

    data = project.data
    args = project.args(*flags)
    device = project.utils.pick_device(args.device)
    info = data.DataInfo(num_classes=10, input_shape=(1, 40))
    val_set = torch.utils.data.TensorDataset(torch.randn(64, 1, 40), torch.arange(64) % 10)
    loader, _, sampler = data.build_loaders(train_set, val_set, info, args, device)
    batches, kept = data.DeviceBatches(loader, info, device), []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        kept = list(batches)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    del batches, loader  # ends persistent workers
    return seconds, kept


def compute_epoch(batches: list, device: str) -> float:
    """Seconds of forward, backward and an AdamW step of conv1d_net over the batches."""
    import torch
    import torch.nn.functional as F

    model = conv1d_net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for inputs, targets in batches[:3]:  # warm-up
        F.cross_entropy(model(inputs), targets).backward()
    start = time.perf_counter()
    for inputs, targets in batches:
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


class ItemByItem:
    """A data set's items without its tensors: what the per-item loader path loads."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.dataset[index]


def tensors_section(options, work: Path, repeats: int) -> str:
    import torch

    common.log("data pipeline: the 4,000 x 40 tensors task, data time against compute")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steady compute on a shared machine; restored below
    project = common.Project(common.render(work / "tensors", data="tensors", extras=[]))
    gen = torch.Generator().manual_seed(0)
    train_set = torch.utils.data.TensorDataset(
        torch.randn(4000, 1, 40, generator=gen), torch.randint(10, (4000,), generator=gen)
    )
    flags = ["--batch-size", "128", "--seed", "0", "--device", options.device]
    configs = [
        ("TensorDataset: whole batches (this path)", train_set, "4"),
        ("per-item loader, 0 workers (before)", ItemByItem(train_set), "0"),
        ("per-item loader, 4 workers capped by the CPUs (before)", ItemByItem(train_set), "4"),
    ]
    ratios: dict[str, list[float]] = {}
    data_ms: dict[str, list[float]] = {}
    compute_ms = []
    try:
        for r in range(repeats):
            compute = None
            for label, dataset, workers in configs[r % 3 :] + configs[: r % 3]:
                seconds, batches = tensors_epoch(project, dataset, [*flags, "--workers", workers])
                if compute is None:
                    compute = compute_epoch(batches, options.device)
                    compute_ms.append(1000 * compute)
                ratios.setdefault(label, []).append(seconds / compute)
                data_ms.setdefault(label, []).append(1000 * seconds)
                common.log(f"  repeat {r + 1}/{repeats}: {label}: {1000 * seconds:.1f} ms")
    finally:
        project.close()
        torch.set_num_threads(threads)
    rows = [
        [label, f"{statistics.median(data_ms[label]):.1f}", common.ratio_cell(ratios[label])]
        for label, *_ in configs
    ]
    fast = statistics.median(ratios[configs[0][0]])
    return "\n\n".join(
        [
            "### Data time against compute: 4,000 x 40 floats in memory, a three-layer Conv1d",
            "Per epoch of 31 batches of 128, one torch thread; compute (forward, backward, "
            f"AdamW step) {statistics.median(compute_ms):.0f} ms, median over {repeats} "
            "repeats. The ratio is data time over the same repeat's compute, median (min–max).",
            common.table(["path", "data ms per epoch", "data / compute"], rows),
            common.verdict(
                fast < 0.05, f"target data / compute < 0.05 on the whole-batch path ({fast:.3f})"
            ),
        ]
    )


def main(argv: list[str] | None = None) -> str:
    import torch

    parser = common.parser(__doc__)
    parser.add_argument("--tensors-only", action="store_true", help="the tensors task alone")
    options = parser.parse_args(argv)
    repeats = options.repeats or (1 if options.quick else 3)
    if options.tensors_only:
        with common.workdir(options.keep) as work:
            return tensors_section(options, work, repeats)
    jpegs, synthetic = (512, 1024) if options.quick else (1536, 2048)
    cuda = options.device.startswith("cuda")
    common_flags = ["--batch-size", "128", "--seed", "0", "--device", options.device]
    with common.workdir(options.keep) as work:
        tensors = tensors_section(options, work, repeats)
        common.log(f"data pipeline: writing {jpegs} JPEGs, preparing the default project")
        write_jpegs(work / "images", jpegs, 64)
        project = common.default_project(options, work)
        sources = {
            "JPEG image folder, 64x64 -> 32x32": [
                "--data", "imagefolder", "--data-dir", str(work / "images"),
                "--image-size", "32",
            ],
            "synthetic set in memory, 32x32": [
                "--data", "synthetic", "--synthetic-size", str(synthetic),
                "--data-on-device", "off",
            ],
        }  # fmt: skip
        # (source, row label, extra flags, pinned); the first row of a source is
        # its baseline.
        configs = []
        for source, flags in sources.items():
            for workers in (0, 1, 2):
                label = f"{workers} workers" if workers != 1 else "1 worker"
                configs.append((source, label, [*flags, "--workers", str(workers)], True))
                if cuda:
                    configs.append(
                        (source, f"{label}, pinned memory off",
                         [*flags, "--workers", str(workers)], False)
                    )  # fmt: skip
            if "synthetic" in source:
                on_device = [*flags[:-1], "on", "--workers", "0"]
                configs.append((source, "on-device path (--data-on-device on)", on_device, True))
        results: dict[tuple[str, str], list[float]] = {}
        try:
            for r in range(repeats):
                shift = r % len(configs)
                for source, label, flags, pin in configs[shift:] + configs[:shift]:
                    speed = measure(project, [*common_flags, *flags], pin)
                    results.setdefault((source, label), []).append(speed)
                    common.log(f"  repeat {r + 1}/{repeats}: {source}, {label}: {speed:.0f}/s")
        finally:
            project.close()

    rows = []
    for source in sources:
        labels = [label for s, label, *_ in configs if s == source]
        baseline = results[(source, labels[0])]
        for label in labels:
            speeds = results[(source, label)]
            ratios = [s / b for s, b in zip(speeds, baseline, strict=True)]
            rows.append(
                [source, label, f"{statistics.median(speeds):.0f}", common.ratio_cell(ratios)]
            )
        if not cuda:
            rows.append([source, "pinned memory on / off", "n/a", "n/a (needs CUDA)"])
    device = torch.cuda.get_device_name() if cuda else "CPU (no CUDA: pinning does not apply)"
    return "\n\n".join(
        [
            "### Data pipeline: the rendered data path alone",
            f"Device: {device}. Ratio to the same source's 0-worker samples/s in the same "
            f"repeat, median (min–max) over {repeats} repeats; samples/s are medians, for "
            "context only.",
            common.table(["source", "loader", "samples/s", "ratio to 0 workers"], rows),
            "No target: this table says which loader settings pay on this machine.",
            tensors,
        ]
    )


if __name__ == "__main__":
    print(main())
