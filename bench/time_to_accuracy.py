"""Time to accuracy by budget: the rendered defaults in a third of a naive loop's time.

    python bench/time_to_accuracy.py [--quick] [--repeats SEEDS] [--synthetic-size N]
                                     [--keep DIR] [--device cuda]

What users do is set `--epochs` for the time they have. For each task the naive loop (the
same model with Adam at a constant lr of 1e-3, batch 32, no schedule, no augmentation,
float32) trains for its full budget, a fixed number of epochs chosen so that it has
plateaued or nearly; its final validation accuracy is the target. Then the template
rendered with its default answers runs train.py as a user would (changing only the data and
model flags, the seed and --epochs), with --epochs set so that the whole run takes at most a
third of the naive loop's time; and so does a second variant, the defaults plus the finders
extra run with `--lr auto`, whose sweep counts against the third. Target, on every task and
seed: each variant's final validation accuracy reaches the naive loop's.

Tasks, none downloaded:
  - the built-in synthetic images (`--synthetic-size` images, 32x32, their own validation
    split; 1500 on a CPU, where a step is slow, and 20000 on a GPU), the built-in ResNet;
  - scikit-learn's bundled digits (1797 8x8 images, 10 classes), written here as PNGs into
    an image folder (every fifth image of each class to val/) and trained the way a user
    would: `--data imagefolder --image-size 8 --hflip 0` (a mirrored digit is no digit),
    with the built-in ResNet. The naive loop reads the same folder with the project's
    validation transform (no random crop, no flip) for both splits;
  - tabular: scikit-learn's make_classification with heavy-tailed features and a user's MLP
    with dropout (`tabular_task`), in a project rendered with `data: tensors`;
  - 1-d signals: issue 27's user task, 4,000 float signals of length 40 (10 classes; 1,000
    more for validation) in a TensorDataset and the user's three-layer Conv1d
    (data_pipeline.py's `conv1d_net`), plugged into a `data: tensors` project
    (`signals_task`).

How the epochs are chosen: on the first seed the naive loop runs first, and a third of its
time is the budget. Then each variant is calibrated by a 2-epoch run (with `--lr auto` for
the finders variant): the time of its first epoch, of each epoch after it and of its sweep.
Its epochs are the most whose predicted time (sweep, first epoch, the rest) fits in 95 % of
the budget (at least 1); the same epochs then run on every seed, and the table reports the
time each run actually took. A short run takes a smaller batch (data.py's short_run_batch),
whose epochs cost another time: the calibration runs at the batch the defaults take for
the epochs it finds, again until the two agree (3 tries at most).

How it is made fair:
  - Both are evaluated on the same validation set, built by the project's build_dataset,
    after every epoch; every run of a seed uses that seed.
  - Same clock: train.py's metrics.csv column `elapsed_s` (wall seconds since its epoch
    loop started, evaluation and checkpoints included), plus, for `--lr auto`, the wall
    time of its sweep (train.py's `auto_lr`, timed here); the naive loop's clock starts
    where its first epoch starts and every epoch's evaluation counts too. Building the data
    set and the model (start-up) is outside every clock.
  - The naive loop loads with 0 workers: with no augmentation its samples cost next to
    nothing to load, and worker processes would only add start-up time.
  - On each seed the three runs alternate their order (naive first on even seeds, last on
    odd ones), so that a machine warming up or a neighbour's burst favours none. The
    1-minute load average before each task is reported.

A run of either variant that was well above chance and ends back near it has collapsed,
and the table counts those.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

SEEDS = 3
SHARE = 3  # the variants get a third of the naive loop's time
MARGIN = 0.95  # of that third, what the predicted time may fill: the machine is noisy
CALIBRATION_EPOCHS = 2
EXTRAS = ["preemption"]  # copier.yml's default extras
VARIANTS = ("defaults", "defaults + finders, --lr auto")


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


def signals_task(project: common.Project):
    """Issue 27's user task: 4,000 float signals of shape (1, 40), 10 classes (the built-in
    generator's kind: two sine waves of the class's frequencies, random phases, strong
    noise, at length 40 and another seed), 1,000 more for validation, in a TensorDataset; the
    user's three-layer Conv1d (data_pipeline.py's `conv1d_net`) as "user_conv1d"."""
    from data_pipeline import conv1d_net

    class Signals40(project.data.SyntheticSignals):
        LENGTH = 40

    train_set, val_set = Signals40(4000, "train", seed=40), Signals40(1000, "val", seed=40)
    info = project.data.DataInfo(10, (1, 40))
    project.models.MODELS["user_conv1d"] = lambda info: conv1d_net(info.input_shape[0])
    project.train.build_dataset = lambda args: (train_set, val_set, info)


@dataclass(frozen=True)
class Task:
    name: str  # short, for the verdicts
    label: str
    data: str  # the render: images or tensors
    flags: tuple[str, ...]
    epochs: int  # the naive loop's budget
    setup: Callable | None = None  # (project) -> None, after each import


@dataclass
class Run:
    history: list[tuple[float, float]]  # (elapsed s, val acc %) after each epoch
    sweep_s: float = 0.0  # --lr auto's sweep
    lr: float | None = None  # the lr the sweep chose
    batch: int | None = None  # the batch it trained at

    @property
    def seconds(self) -> float:
        return self.sweep_s + self.history[-1][0]

    @property
    def final(self) -> float:
        return self.history[-1][1]


def tasks(work: Path, synthetic: int, quick: bool) -> list[Task]:
    digits = ["--data", "imagefolder", "--data-dir", str(work / "digits"), "--image-size", "8",
              "--hflip", "0"]  # fmt: skip
    return [
        Task("images", "synthetic images, 32x32, built-in ResNet", "images",
             ("--synthetic-size", str(synthetic)), 2 if quick else 20),
        Task("digits", "digits (scikit-learn), 8x8 PNG folder, built-in ResNet", "images",
             tuple(digits), 2 if quick else 15),
        Task("tabular", "tabular (make_classification, heavy tails), user's MLP", "tensors",
             ("--model", "user_mlp"), 2 if quick else 40, tabular_task),
        Task("signals", "1-d signals, 4,000 x 40, user's Conv1d", "tensors",
             ("--model", "user_conv1d"), 2 if quick else 20, signals_task),
    ]  # fmt: skip


class Projects:
    """The rendered projects, one imported at a time (the package name is the same)."""

    def __init__(self, paths: dict[tuple[str, bool], Path]) -> None:
        self.paths, self.key, self.project = paths, None, None

    def get(self, data: str, finders: bool, task: Task) -> common.Project:
        if self.key != (data, finders, task.label):
            self.close()
            self.project = common.Project(self.paths[data, finders])
            if task.setup is not None:
                task.setup(self.project)
            self.key = (data, finders, task.label)
        return self.project

    def close(self) -> None:
        if self.project is not None:
            self.project.close()
        self.project = self.key = None


def rendered(project: common.Project, flags: list[str], epochs: int, out: Path) -> Run:
    """train.py's main() as a user runs it, --lr auto's sweep timed."""
    run = Run([])
    auto_lr = getattr(project.train, "auto_lr", None)
    if auto_lr is not None:

        def timed(args, *rest):
            start = time.perf_counter()
            try:
                return auto_lr(args, *rest)
            finally:
                run.sweep_s = time.perf_counter() - start
                run.lr = args.lr

        project.train.auto_lr = timed
    try:
        rows = project.main(*flags, "--epochs", str(epochs), "--out-dir", str(out))
    finally:
        if auto_lr is not None:
            project.train.auto_lr = auto_lr
    run.history = [(row["elapsed_s"], row["val_acc"]) for row in rows]
    import torch

    state = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    run.batch = state["args"]["batch_size"]
    return run


def defaults_batch(project: common.Project, flags: list[str], epochs: int) -> int:
    """The batch train.py takes for `epochs` when --batch-size is not given."""
    args = project.args(*flags, "--epochs", str(epochs))
    short_run_batch = getattr(project.data, "short_run_batch", None)
    if short_run_batch is None:  # a project without the short-run rule
        return args.batch_size
    items = len(project.train.build_dataset(args)[0])
    with common.silenced():
        return short_run_batch(items, args)


def fitting_epochs(calibration: Run, budget: float) -> int:
    """The most epochs whose predicted time (the sweep, the first epoch, then each epoch as
    long as the calibration's later ones) fits in MARGIN of the budget; at least 1."""
    first = calibration.history[0][0]
    per_epoch = (calibration.history[-1][0] - first) / (len(calibration.history) - 1)
    room = MARGIN * budget - calibration.sweep_s - first
    return max(1, 1 + int(room // per_epoch))


def by_epoch(history: list[tuple[float, float]]) -> str:
    return ", ".join(f"{t:.1f}s {acc:.1f}%" for t, acc in history)


def main(argv: list[str] | None = None) -> str:
    parser = common.parser(__doc__)
    parser.add_argument(
        "--synthetic-size",
        type=int,
        default=None,
        help="synthetic training images (default: 1500 on the CPU, 20000 on a GPU)",
    )
    options = parser.parse_args(argv)
    title = "### Time to accuracy by budget: the defaults in a third of a naive loop's time"
    if options.project is not None:  # a machine without Copier
        return f"{title}\n\nNot run: it renders projects of its own, which --project cannot give."
    quick = options.quick
    gpu = options.device.startswith("cuda")
    synthetic = options.synthetic_size or (256 if quick else 20000 if gpu else 1500)
    seeds = options.repeats or (1 if quick else SEEDS)
    device = ["--device", options.device]
    rows, results, loads = [], [], []
    started = time.perf_counter()
    with common.workdir(options.keep) as work:
        common.log("time to accuracy: writing digits, rendering the projects")
        write_digits(work / "digits")
        paths = {}
        for data in ("images", "tensors"):
            for finders in (False, True):
                name = f"{data}{'-finders' if finders else ''}"
                extras = EXTRAS + (["finders"] if finders else [])
                paths[data, finders] = common.render(work / name, data=data, extras=extras)
        projects = Projects(paths)
        task_list = tasks(work, synthetic, quick)
        try:
            for n, task in enumerate(task_list):
                loads.append(os.getloadavg()[0])
                entry = measure_task(projects, task, work / "runs" / str(n), device, seeds, quick)
                results.append(entry)
                rows += table_rows(task, entry)
        finally:
            projects.close()
    header = [
        "task",
        "run",
        "epochs, batch",
        "wall s, median (max)",
        "naive / run time, median (min)",
        "final val acc %, mean (min)",
        "reached the naive final",
        "collapsed",
    ]
    verdicts = []
    for v, variant in enumerate(VARIANTS):
        met = all(all(reached(e, v)) and all(fits(e, v)) for e in results)
        summary = "; ".join(
            f"{task.name}: {sum(reached(e, v))} of {len(e['naive'])} reached, "
            f"{sum(fits(e, v))} in the third"
            for task, e in zip(task_list, results, strict=True)
        )
        verdicts.append(
            common.verdict(
                met,
                f"{variant}: the naive loop's final accuracy reached in a third of its time, "
                f"on every task and seed ({summary})",
            )
        )
    collapses = [sum(collapsed(r.history) for v in (0, 1) for r in e["runs"][v]) for e in results]
    verdicts.append(
        common.verdict(
            not any(collapses),
            "no run of either variant collapsed (fell back to chance for good): "
            + ", ".join(f"{c} of {2 * seeds}" for c in collapses),
        )
    )
    return "\n\n".join(
        [
            title,
            f"{seeds} seeds; on each, the naive loop (Adam 1e-3, batch 32, constant, no "
            "augmentation, float32) trains for its budget and its final validation accuracy "
            "is that seed's target; the defaults (rendered with default answers, as a user "
            "runs train.py) and the defaults with the finders extra and `--lr auto` (its "
            "sweep's time included) run with the most epochs that fit in a third of the naive "
            "time, as calibrated on the first seed. Wall seconds from the first epoch's start, "
            "evaluation included, start-up excluded; the finders' seconds include the sweep "
            "(in brackets: its median seconds and the median lr it chose). 1-minute load "
            "average before each task (2 cores, shared): "
            + ", ".join(f"{load:.1f}" for load in loads)
            + f"; {(time.perf_counter() - started) / 60:.0f} minutes in all.",
            common.table(header, rows),
            *verdicts,
        ]
    )


def measure_task(projects: Projects, task: Task, out: Path, device, seeds: int, quick: bool):
    """The naive runs, the variants' epochs and runs of one task, over the seeds."""
    data_flags = [*task.flags, *device]
    naive_runs: list[Run] = []
    runs: list[list[Run]] = [[], []]
    epochs: list[int] = []

    def run_naive(seed: int) -> None:
        project = projects.get(task.data, False, task)
        history = naive(project, [*data_flags, "--seed", str(seed)], task.epochs)
        naive_runs.append(Run(history))
        common.log(f"  {task.label} seed {seed} naive: {by_epoch(history)}")

    def run_variant(v: int, seed: int, count: int, batch: int | None = None) -> Run:
        project = projects.get(task.data, v == 1, task)
        flags = [*data_flags, "--seed", str(seed)] + (["--lr", "auto"] if v == 1 else [])
        flags += [] if batch is None else ["--batch-size", str(batch)]
        run = rendered(project, flags, count, out / f"{v}-{seed}")
        common.log(
            f"  {task.label} seed {seed} {VARIANTS[v]}, {count} epochs, batch {run.batch}"
            + (f" (sweep {run.sweep_s:.1f}s, lr {run.lr:.3g})" if v == 1 else "")
            + f": {by_epoch(run.history)}"
        )
        return run

    run_naive(0)
    budget = naive_runs[0].seconds / SHARE
    for v in (0, 1):
        # Calibrated at the batch the defaults take for the epochs found (a short run takes a
        # smaller one, whose epochs cost another time): again while the two differ.
        project = projects.get(task.data, v == 1, task)
        batch = defaults_batch(project, data_flags, CALIBRATION_EPOCHS)
        for _ in range(3):
            count = fitting_epochs(run_variant(v, 0, CALIBRATION_EPOCHS, batch), budget)
            if defaults_batch(project, data_flags, count) == batch:
                break
            batch = defaults_batch(project, data_flags, count)
        epochs.append(count)
    common.log(f"  {task.label}: budget {budget:.1f}s, epochs {epochs}")
    for seed in range(seeds):
        if seed > 0 and seed % 2 == 0:
            run_naive(seed)
        for v in (0, 1) if seed % 2 == 0 else (1, 0):
            runs[v].append(run_variant(v, seed, epochs[v]))
        if seed % 2 == 1:
            run_naive(seed)
    return {"naive": naive_runs, "runs": runs, "epochs": epochs}


def reached(entry: dict, v: int) -> list[bool]:
    """Per seed: whether the variant's final accuracy reached that seed's naive final."""
    return [
        run.final >= target.final - 1e-9
        for run, target in zip(entry["runs"][v], entry["naive"], strict=True)
    ]


def fits(entry: dict, v: int) -> list[bool]:
    """Per seed: whether the variant's whole run took at most a third of the naive time."""
    return [
        SHARE * run.seconds <= target.seconds
        for run, target in zip(entry["runs"][v], entry["naive"], strict=True)
    ]


def table_rows(task: Task, entry: dict) -> list[list[str]]:
    naive_runs = entry["naive"]
    finals = [run.final for run in naive_runs]
    seconds = [run.seconds for run in naive_runs]
    rows = [
        [
            task.label,
            "naive (the target)",
            f"{task.epochs}, batch 32",
            f"{statistics.median(seconds):.1f} ({max(seconds):.1f})",
            "1",
            f"{statistics.fmean(finals):.2f} ({min(finals):.2f})",
            "—",
            "—",
        ]
    ]
    for v, variant in enumerate(VARIANTS):
        runs = entry["runs"][v]
        seconds = [run.seconds for run in runs]
        finals = [run.final for run in runs]
        ratios = [t.seconds / run.seconds for run, t in zip(runs, naive_runs, strict=True)]
        wall = f"{statistics.median(seconds):.1f} ({max(seconds):.1f})"
        if v == 1:
            sweep = statistics.median(run.sweep_s for run in runs)
            lr = statistics.median(run.lr for run in runs)
            wall += f" [sweep {sweep:.1f} s, lr {lr:.3g}]"
        rows.append(
            [
                "",
                variant,
                f"{entry['epochs'][v]}, batch {'/'.join(sorted({str(r.batch) for r in runs}))}",
                wall,
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f})",
                f"{statistics.fmean(finals):.2f} ({min(finals):.2f})",
                f"{sum(reached(entry, v))} of {len(runs)}",
                f"{sum(collapsed(run.history) for run in runs)} of {len(runs)}",
            ]
        )
    return rows


if __name__ == "__main__":
    print(main())
