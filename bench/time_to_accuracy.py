"""Time to accuracy: the rendered defaults against a naive loop, on three small tasks.

    python bench/time_to_accuracy.py [--quick] [--repeats N] [--synthetic-size N]
                                     [--device cuda] [--project DIR]

The template is rendered with its default answers (SGD with Nesterov momentum at the
default lr, gradients clipped at norm 1, linear warmup then cosine, batch 128, augmentation
for images; bf16 autocast on a GPU, float32 on a CPU) and its train.py runs as a user would
run it, changing only the data and model flags and --epochs: both loops get the same
number of epochs (the defaults' schedule spans them). The naive loop trains the same model
with Adam at a constant lr of 1e-3, batch 32, no schedule and no augmentation, in float32;
its final validation accuracy is the target.

Tasks:
  - the built-in synthetic set (`--synthetic-size` images, 32x32, its own validation split;
    1500 on a CPU, where a step is slow, and 20000 on a GPU) and the built-in ResNet;
  - scikit-learn's bundled digits (1797 8x8 images, 10 classes), written here as PNGs into
    an image folder (every fifth image of each class to val/) and trained the way a user
    would: `--data imagefolder --image-size 8 --hflip 0` (a mirrored digit is no digit),
    with the built-in ResNet. The naive loop reads the same folder with the project's
    validation transform (no random crop, no flip) for both splits;
  - not images: scikit-learn's make_classification with heavy-tailed features and an MLP
    with dropout, the kind of data set and model a user brings (`tabular_task`).

The defaults also run alone on more seeds: a run that was well above chance and ends back
near it has collapsed, and the table counts those.

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
PAIRS = 3  # seeds on which the naive loop and the defaults run side by side
SEEDS = 5  # seeds of the defaults, for the collapse count


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
    train_set, val_set, info = project.train.build_dataset(args)
    if hasattr(train_set, "transform"):
        train_set.transform = val_set.transform  # no augmentation (None for the synthetic set)
    loader = DataLoader(train_set, batch_size=32, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=256)
    model = project.models.build_model(args.model, info).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    shape = (1, -1) + (1,) * (len(info.input_shape) - 1)  # one value per channel
    mean = torch.tensor(info.mean or [0.0], device=device).view(shape)
    std = torch.tensor(info.std or [1.0], device=device).view(shape)

    history = []
    start = time.perf_counter()
    for _ in range(epochs):
        model.train()
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            loss = F.cross_entropy(model((inputs.float() - mean) / std), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for inputs, targets in val_loader:
                inputs, targets = inputs.to(device), targets.to(device)
                logits = model((inputs.float() - mean) / std)
                correct += (logits.argmax(1) == targets).sum().item()
                total += targets.numel()
        history.append((time.perf_counter() - start, 100 * correct / total))
    return history


def tabular_task(project: common.Project):
    """A data set and a model a user might bring, as a user would plug them in: scikit-learn's
    make_classification (5000 rows, 20 features, 10 classes, 5 % of labels flipped) with four
    features made heavy-tailed (log-normal, as amounts or counts are), standardised through
    DataInfo; an MLP of three hidden layers of 256 with dropout 0.5. --data synthetic then
    trains it (build_dataset and MODELS patched in this process)."""
    import numpy as np
    import torch
    import torch.nn as nn
    from sklearn.datasets import make_classification
    from torch.utils.data import TensorDataset

    x, y = make_classification(
        n_samples=5000, n_features=20, n_informative=12, n_redundant=4, n_classes=10,
        n_clusters_per_class=1, class_sep=1.0, flip_y=0.05, random_state=72,
    )  # fmt: skip
    x[:, :4] = np.exp(x[:, :4])
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    train_set, val_set = TensorDataset(x[:4000], y[:4000]), TensorDataset(x[4000:], y[4000:])
    mean, std = x[:4000].mean(0).tolist(), x[:4000].std(0).tolist()
    info = project.data.DataInfo(10, (20,), tuple(mean), tuple(std))

    def user_mlp(info):
        layers, width = [], info.input_shape[0]
        for _ in range(3):
            layers += [nn.Linear(width, 256), nn.ReLU(), nn.Dropout(0.5)]
            width = 256
        return nn.Sequential(*layers, nn.Linear(width, info.num_classes))

    project.models.MODELS["user_mlp"] = user_mlp
    project.train.build_dataset = lambda args: (train_set, val_set, info)


def collapsed(history: list[tuple[float, float]], chance: float = 10.0) -> bool:
    """Whether a run lost its accuracy for good: well above chance once (20 points), and back
    near it (within a fifth of what it had gained) at its end."""
    best, final = max(acc for _, acc in history), history[-1][1]
    return best - chance >= 20 and final - chance <= (best - chance) / 5


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
        build_dataset = project.train.build_dataset
        device = ["--device", options.device]
        # label, data flags, epochs (both), set-up
        sets = [
            ("synthetic, 32x32",
             ["--synthetic-size", str(synthetic)],
             2 if quick else 10, None),
            ("digits (scikit-learn), 8x8 PNG folder",
             ["--data", "imagefolder", "--data-dir", str(work / "digits"), "--image-size", "8",
              "--hflip", "0"],
             2 if quick else 20, None),
            ("tabular (make_classification, heavy tails), user's MLP",
             ["--model", "user_mlp"],
             2 if quick else 30, tabular_task),
        ]  # fmt: skip
        pairs = options.repeats or (1 if quick else PAIRS)
        seeds = 1 if quick else SEEDS
        rows, ratios_all, collapses = [], [], []
        try:
            for n, (label, data_flags, epochs, setup) in enumerate(sets):
                project.train.build_dataset = build_dataset
                if setup is not None:
                    setup(project)
                results, finals = [], []
                for seed in range(max(pairs, seeds)):
                    flags = [*data_flags, *device, "--seed", str(seed)]
                    out = ["--out-dir", str(work / "runs" / str(n))]

                    def run_defaults(flags=flags, out=out, epochs=epochs):
                        rows = project.main(*flags, "--epochs", str(epochs), *out)
                        return [(row["elapsed_s"], row["val_acc"]) for row in rows]

                    if seed >= pairs:  # the defaults alone: how often they collapse
                        defaults_history = run_defaults()
                        finals.append(defaults_history)
                        common.log(f"  {label} seed {seed}: " + by_epoch(defaults_history))
                        continue
                    if seed % 2 == 0:
                        naive_history = naive(project, flags, epochs)
                        defaults_history = run_defaults()
                    else:
                        defaults_history = run_defaults()
                        naive_history = naive(project, flags, epochs)
                    finals.append(defaults_history)
                    target = naive_history[-1][1]
                    naive_time = first_reaching(naive_history, target)
                    defaults_time = first_reaching(defaults_history, target)
                    results.append((target, naive_time, defaults_time, defaults_history))
                    shown = "not reached" if defaults_time is None else f"{defaults_time:.1f} s"
                    common.log(
                        f"  {label} pair {seed + 1}/{pairs}: target {target:.2f}% naive "
                        f"{naive_time:.1f} s, defaults {shown} "
                        f"(final {defaults_history[-1][1]:.2f}%)"
                    )
                    for name, history in (("naive", naive_history), ("defaults", defaults_history)):
                        common.log(f"    {name} by epoch: {by_epoch(history)}")
                collapses.append(sum(collapsed(history) for history in finals))
                reached = [(t, nt, dt) for t, nt, dt, _ in results if dt is not None]
                ratios = [nt / dt for _, nt, dt in reached]
                ratios_all.append(statistics.median(ratios) if len(reached) == pairs else None)
                rows.append(
                    [
                        label,
                        f"{epochs}",
                        f"{statistics.median(t for t, *_ in results):.2f}",
                        f"{statistics.median(nt for _, nt, *_ in results):.1f}",
                        f"{statistics.median(h[-1][1] for h in finals):.2f}",
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
                        f"{collapses[-1]} of {len(finals)}",
                    ]
                )
        finally:
            project.train.build_dataset = build_dataset
            project.close()
    header = [
        "task",
        "epochs (both)",
        "target: naive final val acc %",
        "naive s to target",
        "defaults final val acc %",
        "defaults s to target",
        "naive / defaults time",
        "defaults runs collapsed",
    ]
    summary = ", ".join(
        f"{label}: " + (f"{m:.2f}" if m is not None else "target not reached")
        for (label, *_), m in zip(sets, ratios_all, strict=True)
    )
    return "\n\n".join(
        [
            "### Time to accuracy: rendered defaults vs a naive loop",
            f"Medians over {pairs} seeds, each a pair run side by side (min–max of the ratio "
            f"in brackets); the defaults also ran alone on more seeds, {seeds} in all, for the "
            "collapse count. Times are wall seconds with evaluation, known to the epoch.",
            common.table(header, rows),
            common.verdict(
                all(m is not None and m >= TARGET for m in ratios_all),
                f"target naive / defaults time >= {TARGET:.0f} on every task ({summary})",
            ),
            common.verdict(
                not any(collapses),
                "no run of the defaults collapsed (fell back to chance for good): "
                + ", ".join(f"{c} of {seeds}" for c in collapses),
            ),
        ]
    )


def by_epoch(history: list[tuple[float, float]]) -> str:
    return ", ".join(f"{t:.1f}s {acc:.1f}%" for t, acc in history)


if __name__ == "__main__":
    print(main())
