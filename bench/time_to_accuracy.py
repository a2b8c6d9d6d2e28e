"""Time to accuracy: the rendered defaults against a naive loop, on two small data sets.

    python bench/time_to_accuracy.py [--quick] [--repeats N] [--synthetic-size N]
                                     [--device cuda] [--project DIR]

The template is rendered with its default answers (SGD with Nesterov momentum at the
default lr, linear warmup then cosine, batch 128, augmentation, and the synthetic set kept
where the model trains, batches cut and augmented there; bf16 autocast on a GPU, float32
on a CPU; digits come from an image folder through the loader and its workers) and its
train.py runs as a user would run it, changing only the data flags and --epochs: both
loops get the same number of epochs (the defaults' schedule spans them). The naive loop trains the
same model (the built-in ResNet) with Adam at a constant lr of 1e-3, batch 32, no schedule
and no augmentation, in float32; its final validation accuracy is the target.

Data sets:
  - the built-in synthetic set (`--synthetic-size` images, 32x32, its own validation split;
    1500 on a CPU, where a step is slow, and 20000 on a GPU);
  - scikit-learn's bundled digits (1797 8x8 images, 10 classes), written here as PNGs into
    an image folder (every fifth image of each class to val/) and trained the way a user
    would: `--data imagefolder --image-size 8 --hflip 0` (a mirrored digit is no digit).
    The naive loop reads the same folder with the project's validation transform (no
    random crop, no flip) for both splits.

How it is made fair:
  - Both are evaluated on the same validation set, built by the project's build_dataset,
    after every epoch; both use the same seed in a pair (each pair a different seed).
  - Same clock: train.py's metrics.csv column `elapsed_s` (wall seconds since its epoch
    loop started, evaluation and checkpoints included); the naive loop's clock starts
    where its first epoch starts and every epoch's evaluation counts too. Building the
    data set and the model is outside both clocks.
  - The time to the target is the elapsed time at the end of the first epoch whose
    validation accuracy reaches it, for both (the naive loop may reach its final accuracy
    before its last epoch). Evaluation happens once per epoch, so times are known to the
    epoch.
  - The naive loop loads with 0 workers: with no augmentation its samples cost next to
    nothing to load, and worker processes would only add start-up time.
  - Pairs alternate which run goes first. These runs are long on a CPU, so there are
    fewer pairs than in the other benchmarks (see the table).

The ratio is naive time / defaults time: 3.0 means the defaults reach the naive loop's
final accuracy in a third of its time. Target: >= 3.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

TARGET = 3.0


def write_digits(root: Path) -> None:
    """scikit-learn's digits as 8-bit grey PNGs: root/{train,val}/<digit>/*.png."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    counts: dict[int, int] = {}
    for image, label in zip(digits.images, digits.target, strict=True):
        label = int(label)
        n = counts[label] = counts.get(label, 0) + 1
        split = "val" if n % 5 == 0 else "train"
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.round(image * 255 / 16).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"{n:04d}.png")


def naive(project: common.Project, flags: list[str], epochs: int) -> list[tuple[float, float]]:
    """The naive loop; returns (elapsed seconds, val accuracy %) after each epoch."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    args = project.args(*flags)
    device = project.utils.pick_device(args.device)
    project.utils.seed_everything(args.seed, False)
    train_set, val_set, info = project.data.build_dataset(args)
    train_set.transform = val_set.transform  # no augmentation (None for the synthetic set)
    loader = DataLoader(train_set, batch_size=32, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=256)
    model = project.models.build_model(args.model, info).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    mean = torch.tensor(info.mean, device=device).view(1, -1, 1, 1)
    std = torch.tensor(info.std, device=device).view(1, -1, 1, 1)

    history = []
    start = time.perf_counter()
    for _ in range(epochs):
        model.train()
        for images, targets in loader:
            images, targets = images.to(device), targets.to(device)
            loss = F.cross_entropy(model((images.float() - mean) / std), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, targets in val_loader:
                images, targets = images.to(device), targets.to(device)
                logits = model((images.float() - mean) / std)
                correct += (logits.argmax(1) == targets).sum().item()
                total += targets.numel()
        history.append((time.perf_counter() - start, 100 * correct / total))
    return history


def first_reaching(history: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, acc in history if acc >= target - 1e-9), None)


def main(argv: list[str] | None = None) -> str:
    parser = common.parser(__doc__)
    parser.add_argument(
        "--synthetic-size",
        type=int,
        default=None,
        help="synthetic training images (default: 1500 on the CPU, 20000 on a GPU)",
    )
    options = parser.parse_args(argv)
    quick = options.quick
    gpu = options.device.startswith("cuda")
    synthetic = options.synthetic_size or (256 if quick else 20000 if gpu else 1500)
    with common.workdir(options.keep) as work:
        common.log("time to accuracy: writing digits, preparing the default project")
        write_digits(work / "digits")
        project = common.default_project(options, work)
        device = ["--device", options.device]
        # label, data flags, epochs (both), pairs
        sets = [
            ("synthetic, 32x32",
             ["--synthetic-size", str(synthetic)],
             2 if quick else 5, 2),
            ("digits (scikit-learn), 8x8 PNG folder",
             ["--data", "imagefolder", "--data-dir", str(work / "digits"), "--image-size", "8",
              "--hflip", "0"],
             2 if quick else 20, 3),
        ]  # fmt: skip
        rows, ratios_all = [], []
        try:
            for n, (label, data_flags, naive_epochs, pairs) in enumerate(sets):
                default_flags = ["--epochs", str(naive_epochs)]
                pairs = options.repeats or (1 if quick else pairs)
                results = []
                for r in range(pairs):
                    flags = [*data_flags, *device, "--seed", str(r)]
                    out = ["--out-dir", str(work / "runs" / str(n))]

                    def run_defaults(flags=flags, out=out, extra=default_flags):
                        rows = project.main(*flags, *extra, *out)
                        return [(row["elapsed_s"], row["val_acc"]) for row in rows]

                    def run_naive(flags=flags, epochs=naive_epochs):
                        return naive(project, flags, epochs)

                    if r % 2 == 0:
                        naive_history, defaults_history = run_naive(), run_defaults()
                    else:
                        defaults_history, naive_history = run_defaults(), run_naive()
                    target = naive_history[-1][1]
                    naive_time = first_reaching(naive_history, target)
                    defaults_time = first_reaching(defaults_history, target)
                    results.append((target, naive_time, defaults_time, defaults_history))
                    shown = "not reached" if defaults_time is None else f"{defaults_time:.1f} s"
                    common.log(
                        f"  {label} pair {r + 1}/{pairs}: target {target:.2f}% naive "
                        f"{naive_time:.1f} s, defaults {shown} "
                        f"(final {defaults_history[-1][1]:.2f}%)"
                    )
                    for name, history in (("naive", naive_history), ("defaults", defaults_history)):
                        epochs = " ".join(f"{t:.1f}s {acc:.1f}%," for t, acc in history)
                        common.log(f"    {name} by epoch: {epochs.rstrip(',')}")
                reached = [(t, nt, dt) for t, nt, dt, _ in results if dt is not None]
                ratios = [nt / dt for _, nt, dt in reached]
                ratios_all.append(statistics.median(ratios) if len(reached) == pairs else None)
                epochs_run = len(results[0][3])
                rows.append(
                    [
                        label,
                        f"{naive_epochs}",
                        f"{statistics.median(t for t, *_ in results):.2f}",
                        f"{statistics.median(nt for _, nt, *_ in results):.1f}",
                        f"{epochs_run}",
                        f"{statistics.median(h[-1][1] for *_, h in results):.2f}",
                        (
                            f"{statistics.median(dt for *_, dt in reached):.1f}"
                            if reached
                            else "not reached"
                        ),
                        (
                            common.ratio_cell(ratios)
                            + (
                                ""
                                if len(reached) == pairs
                                else f" ({pairs - len(reached)} not reached)"
                            )
                            if ratios
                            else "—"
                        ),
                        str(pairs),
                    ]
                )
        finally:
            project.close()
    header = [
        "data set",
        "naive epochs",
        "target: naive final val acc %",
        "naive s to target",
        "defaults epochs",
        "defaults final val acc %",
        "defaults s to target",
        "naive / defaults time",
        "pairs",
    ]
    summary = ", ".join(
        f"{label}: " + (f"{m:.2f}" if m is not None else "target not reached")
        for (label, *_), m in zip(sets, ratios_all, strict=True)
    )
    return "\n\n".join(
        [
            "### Time to accuracy: rendered defaults vs a naive loop",
            "Medians over pairs (min–max of the ratio in brackets); times are wall seconds "
            "with evaluation, known to the epoch.",
            common.table(header, rows),
            common.verdict(
                all(m is not None and m >= TARGET for m in ratios_all),
                f"target naive / defaults time >= {TARGET:.0f} on both sets ({summary})",
            ),
        ]
    )


if __name__ == "__main__":
    print(main())
