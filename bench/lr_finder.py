"""LR finder: the suggestion of --find-lr against the best of a trained grid of constant
learning rates, on five small tasks, for SGD, AdamW and LAMB.

    python bench/lr_finder.py [--quick] [--repeats SEEDS] [--keep DIR] [--record DIR]
                              [--offline DIR] [--extra-steps N ...] [--tasks NAME ...]
                              [--optimizers NAME ...] [--device cuda] [--schedule default]
                              [--scheduled DIR]

For each optimizer the template is rendered twice with the finders extra and a constant
schedule (`scheduler: constant`, run with `--warmup-steps 0`): once with images, once with
your own tensors. The tasks, each trained as a user would run it:

  - images: the built-in synthetic images at 8x8, the built-in MLP;
  - digits: scikit-learn's digits written as a PNG image folder (as in time_to_accuracy.py),
    `--data imagefolder --image-size 8 --hflip 0`, the built-in ResNet;
  - signals: the built-in synthetic 1-d signals (data: tensors), the built-in cnn1d;
  - tabular: make_classification with heavy-tailed features and a user's MLP with dropout
    (time_to_accuracy.py's `tabular_task`), plugged in as the README says;
  - regression: scikit-learn's make_friedman1 (10 features, a smooth non-linear target,
    not standardised) with the built-in MLP, the loss made the mean squared error through
    the README's own-loss seam (`compute_loss`, `metric_sums`, `score`, `target_problem`).

The grid: 7 learning rates a factor of 2 apart, from an eighth to 8 times the optimizer's
default lr (the answer's), each trained the same epochs from the same 3 seeds with no
schedule and the run's other defaults (gradient clipping included). While the best rate is
at an end of the grid, the grid grows by one rate at that end (3 at most a side). The best
is the rate with the best final validation accuracy (the lowest final validation loss for
the regression), averaged over the seeds.

The finder's sweep (its default range and steps, with the run's gradient clipping) runs
from the same 3 seeds (--repeats), on the same task with the same flags, over the whole
range with its stopping rule turned off; the rendered finders.py's own stopping rule and
suggestion, applied to that sweep step by step, give what --find-lr suggests (up to where
it stops, --find-lr makes the very same sweep: on the first seed --find-lr itself runs too,
and must agree). The ratio is the suggestion / the grid's best. Target: within 2x on every
task, optimizer and seed.

Every sweep's lr_find.csv is kept under --record (default build/lr_finder), with the
grid's results (grid.json): besides the sweep with the run's clipping, each seed is swept
without clipping (for SGD and AdamW, which clip by default) and, with --extra-steps, in as
many steps, so that other stopping and suggestion rules (`STOPS`, `RULES`) are compared on
the same sweeps. `--offline DIR` compares them again from a record, without training.
10-12 minutes of one CPU core (measured with --extra-steps 100).

`--scheduled DIR` (a record of `--schedule default`, below) compares the suggestion rules
with the best peak of each task and optimizer under the default schedule too, which is what
--lr auto sets: `--offline build/lr_finder --scheduled build/lr_finder-scheduled`.

`--schedule default` trains the same grid under the run's default schedule instead (the
answer's `scheduler: warmup_cosine`, its default warmup of one epoch, a cosine down to a
hundredth of the peak), with no sweeps: the peak rate that does best across the tasks is
what copier.yml's `lr` defaults are chosen on. Every grid run's training loss at each
optimizer step is kept (in grid.json, default record
build/lr_finder-scheduled): the one-line hint of a learning rate far off (schedule.py's
`lr_hint`) is chosen on them, against the rates 8x or more from each task's best and
those within 2x: there the grid also grows (6 rates at most) until it reaches 8x either
way of its best. 15-25 minutes of one CPU core.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from time_to_accuracy import tabular_task, write_digits  # noqa: E402

TARGET = 2.0  # the suggestion within this factor of the grid's best
SEEDS = 3
OPTIMIZERS = ("sgd", "adamw", "lamb")
DEFAULT_LR = {"sgd": 0.2, "adamw": 0.002, "lamb": 0.01}  # the grid's centre: copier.yml's
# defaults before issue 27 (0.016 and 0.04 since), kept so that the grids stay the same
GRID = [2.0**k for k in range(-3, 4)]  # times the default lr
GROW = 3  # rates the grid may grow by at each end
REACH, REACH_STEPS = 8, 6  # --schedule default: then it grows to 8x either way of the best


@dataclass(frozen=True)
class Task:
    name: str
    data: str  # the render: images or tensors
    flags: tuple[str, ...]
    epochs: int
    setup: Callable | None = None  # (project, work folder) -> None, before each run
    regression: bool = False


def friedman_task(project: common.Project, work: Path) -> None:
    """A regression a user might bring: make_friedman1 (2500 rows, 10 features, noise 1),
    inputs standardised through DataInfo, the float target (mean 14, std 5) as it is; the
    README's mean squared error, metrics and score (own loss), and its target check."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import make_friedman1
    from torch.utils.data import TensorDataset

    x, y = make_friedman1(n_samples=2500, n_features=10, noise=1.0, random_state=27)
    x = torch.tensor(x, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)
    train_set, val_set = TensorDataset(x[:2000], y[:2000]), TensorDataset(x[2000:], y[2000:])
    mean, std = x[:2000].mean(0).tolist(), x[:2000].std(0).tolist()
    info = project.data.DataInfo(1, (10,), tuple(mean), tuple(std))

    def compute_loss(outputs, targets, *rest):
        return F.mse_loss(outputs, targets)

    def metric_sums(outputs, targets):
        error = (outputs.float() - targets).flatten(1)
        return {"loss": error.pow(2).mean(1).sum(), "mae": error.abs().mean(1).sum()}

    def target_problem(targets, info):
        if not isinstance(targets, torch.Tensor) or targets.dtype != torch.float32:
            return "targets are not float32 tensors"
        return None

    project.train.compute_loss = compute_loss
    project.train.metric_sums = metric_sums
    project.train.score = lambda row: -row["val_loss"]
    project.data.target_problem = target_problem
    project.train.build_dataset = lambda args: (train_set, val_set, info)


def digits_task(project: common.Project, work: Path) -> None:
    if not (work / "digits").is_dir():
        write_digits(work / "digits")


COMMON = ("--workers", "0", "--warmup-steps", "0")  # --schedule default: no --warmup-steps
TASKS = [
    Task("images", "images",
         ("--synthetic-size", "1024", "--image-size", "8", "--model", "mlp", "--batch-size", "32"),
         4),
    Task("digits", "images",
         ("--data", "imagefolder", "--data-dir", "DIGITS", "--image-size", "8", "--hflip", "0",
          "--model", "resnet_small", "--batch-size", "32"),
         3, digits_task),
    Task("signals", "tensors", ("--synthetic-size", "1024", "--batch-size", "32"), 6),
    Task("tabular", "tensors", ("--model", "user_mlp", "--batch-size", "64"), 4,
         lambda project, work: tabular_task(project)),
    Task("regression", "tensors", ("--model", "mlp", "--batch-size", "32"), 5, friedman_task,
         regression=True),
]  # fmt: skip
QUICK_SIZES = {"--synthetic-size": "256"}


# Candidate rules, compared offline on the same sweeps: a stopping rule says where a sweep
# that ran over the whole range would have stopped, a suggestion rule reads the lr from the
# part of the sweep before that point (the sweep as the chosen stopping rule leaves it).
BETA = 0.9  # the finder's smoothing
FIRST = 10  # the first steps: their mean is the loss the sweep starts at, their spread its noise


def smooth(losses: list[float]) -> list[float]:
    """The finder's smoothing: an exponential moving average, bias-corrected."""
    average, out = 0.0, []
    for step, loss in enumerate(losses):
        average = BETA * average + (1 - BETA) * loss
        out.append(average / (1 - BETA ** (step + 1)))
    return out


def times_lowest(factor: float):
    """Diverged: the smoothed loss exceeds its lowest so far `factor` times (v0.9's rule)."""
    return lambda losses, smoothed, step: smoothed[step] > factor * min(smoothed[:step])


def climbed_back(fraction: float, noise: float):
    """Diverged: the smoothed loss climbed back `fraction` of the way from its lowest so far
    to the start, once that lowest is below the start by `noise` times the first steps'
    spread (0: as soon as it is below)."""

    def stop(losses, smoothed, step) -> bool:
        first = losses[:FIRST]
        start, spread = statistics.fmean(first), statistics.pstdev(first)
        lowest = min(smoothed[:step])
        if step < FIRST or start - lowest <= noise * spread:
            return False
        return smoothed[step] > lowest + fraction * (start - lowest)

    return stop


STOPS: dict[str, Callable] = {
    "4x lowest": times_lowest(4.0),
    "back 1/2 to start": climbed_back(0.5, 0.0),
    "back 1/4 to start, 3 spreads": climbed_back(0.25, 3.0),
    "back 1/2 to start, 3 spreads": climbed_back(0.5, 3.0),
    "back to start, 3 spreads": climbed_back(1.0, 3.0),
}
CHOSEN_STOP = "back 1/2 to start, 3 spreads"


def stopped(stop: Callable, losses: list[float]) -> int | None:
    """The step at which a sweep with this stopping rule would have stopped; None if never."""
    smoothed = smooth(losses)
    for step in range(1, len(losses)):
        if not math.isfinite(smoothed[step]) or stop(losses, smoothed, step):
            return step
    return None


def lowest(smoothed: list[float]) -> int:
    finite = [i for i, x in enumerate(smoothed) if math.isfinite(x)]
    return min(finite, key=smoothed.__getitem__)


def at_minimum(divisor: float):
    def rule(lrs, losses, smoothed) -> float:
        return lrs[lowest(smoothed)] / divisor

    return rule


def steepest(lrs, losses, smoothed) -> float:
    """The lr where the smoothed loss falls fastest against log lr, before its lowest."""
    end = lowest(smoothed)
    if end < 2:
        return lrs[end]
    slopes = [smoothed[i + 1] - smoothed[i - 1] for i in range(1, end)]
    return lrs[1 + min(range(len(slopes)), key=slopes.__getitem__)]


def fallen(fraction: float):
    """The first lr where the smoothed loss has fallen `fraction` of the way from the start
    to its lowest."""

    def rule(lrs, losses, smoothed) -> float:
        end, start = lowest(smoothed), statistics.fmean(losses[:FIRST])
        level = start - fraction * (start - smoothed[end])
        return lrs[next(i for i in range(end + 1) if smoothed[i] <= level)]

    return rule


def climbing(fraction: float, divisor: float):
    """The lr past the lowest where the smoothed loss is back `fraction` of the way to the
    start, divided by `divisor`."""

    def rule(lrs, losses, smoothed) -> float:
        end, start = lowest(smoothed), statistics.fmean(losses[:FIRST])
        level = smoothed[end] + fraction * (start - smoothed[end])
        back = next((i for i in range(end, len(smoothed)) if smoothed[i] >= level), None)
        return lrs[len(lrs) - 1 if back is None else back] / divisor

    return rule


def at_stop(divisor: float):
    """The lr where the sweep stopped (its last), divided by `divisor`."""
    return lambda lrs, losses, smoothed: lrs[-1] / divisor


def valley(fraction: float):
    """The lr `fraction` of the way (in steps, so in log lr) along the longest run of
    falling smoothed losses before the lowest one: the longest decreasing subsequence ending
    anywhere up to the lowest, from where it starts to where it ends."""

    def rule(lrs, losses, smoothed) -> float:
        end = lowest(smoothed)
        length, start_of = [1] * (end + 1), list(range(end + 1))
        for i in range(end + 1):
            for j in range(i):
                if smoothed[j] > smoothed[i] and length[j] + 1 > length[i]:
                    length[i], start_of[i] = length[j] + 1, start_of[j]
        last = max(range(end + 1), key=lambda i: (length[i], -i))
        first = start_of[last]
        return lrs[first + round(fraction * (last - first))]

    return rule


RULES: dict[str, Callable] = {
    "lowest / 20": at_minimum(20),
    "lowest / 10": at_minimum(10),
    "lowest / 8": at_minimum(8),
    "lowest / 5": at_minimum(5),
    "lowest / 3": at_minimum(3),
    "lowest / 2": at_minimum(2),
    "lowest / 1.5": at_minimum(1.5),
    "lowest": at_minimum(1),
    "where it stopped / 4": at_stop(4),
    "where it stopped / 2": at_stop(2),
    "steepest": steepest,
    "fallen 1/2 of the way": fallen(0.5),
    "fallen 9/10 of the way": fallen(0.9),
    "back 1/4 to start, / 20": climbing(0.25, 20),
    "valley 1/2": valley(0.5),
    "valley 2/3": valley(2 / 3),
    "valley 4/5": valley(0.8),
}


def factor(ratio: float) -> float:
    """How far a ratio is from 1, either way: 0.5 and 2 are both 2."""
    return max(ratio, 1 / ratio) if ratio > 0 and math.isfinite(ratio) else math.inf


# Running the rendered project.
def render_projects(work: Path, optimizers, datas, schedule: str) -> dict[tuple[str, str], Path]:
    paths = {}
    for optimizer in optimizers:
        for data in datas:
            dest = work / f"{data}-{optimizer}"
            common.log(f"lr finder: rendering {dest.name}")
            answers = dict(optimizer=optimizer, extras=["finders"])
            if schedule == "constant":
                answers["scheduler"] = "constant"
            paths[data, optimizer] = common.render(dest, data=data, **answers)
    return paths


def task_flags(task: Task, work: Path, options) -> list[str]:
    flags = [str(work / "digits") if f == "DIGITS" else f for f in task.flags]
    if options.quick:
        flags = [QUICK_SIZES.get(prev, f) for prev, f in zip(["", *flags[:-1]], flags, strict=True)]
    run = COMMON if options.schedule == "constant" else COMMON[:2]
    return [*run, "--device", options.device, *flags]


def final_metric(project: common.Project, flags: list[str], regression: bool) -> float:
    """The final validation accuracy, or the negated final validation loss (higher is better
    either way; a run whose loss is not finite scores minus infinity)."""
    last = project.main(*flags)[-1]
    value = -last["val_loss"] if regression else last["val_acc"]
    return value if math.isfinite(value) else -math.inf


@contextlib.contextmanager
def step_losses(project: common.Project):
    """A list that gets the training loss of every optimizer step (one micro-batch a step,
    --accum-steps 1) while the project's compute_loss is wrapped."""
    losses: list[float] = []
    inner = project.train.compute_loss

    def compute_loss(*given):
        loss = inner(*given)
        losses.append((loss[0] if isinstance(loss, tuple) else loss).item())
        return loss

    project.train.compute_loss = compute_loss
    try:
        yield losses
    finally:
        project.train.compute_loss = inner


def train_grid(project, task, flags, out: Path, optimizer: str, seeds: int, grid, epochs: int,
               steps: dict | None = None):  # fmt: skip
    """{lr: [final metric of each seed]}, grown at an end while the best is there; with
    `steps`, steps[lr] gets each seed's training loss at every optimizer step."""
    results: dict[float, list[float]] = {}
    lrs = [DEFAULT_LR[optimizer] * k for k in grid]

    def train(lr: float) -> None:
        runs = []
        for seed in range(seeds):
            extra = ["--lr", f"{lr:.6g}", "--epochs", str(epochs), "--seed", str(seed)]
            extra += ["--out-dir", str(out)]
            with step_losses(project) as losses:
                runs.append(final_metric(project, [*flags, *extra], task.regression))
            if steps is not None:
                steps.setdefault(lr, []).append(losses)
        results[lr] = runs
        common.log(f"  {task.name} {optimizer} lr {lr:.4g}: {shown(runs, task.regression)}")

    for lr in lrs:
        train(lr)
    for _ in range(GROW if len(grid) > 3 else 0):
        best = max(results, key=lambda lr: statistics.fmean(results[lr]))
        ordered = sorted(results)
        if best == ordered[0]:
            train(ordered[0] / 2)
        elif best == ordered[-1]:
            train(ordered[-1] * 2)
        else:
            break
    for _ in range(REACH_STEPS if steps is not None else 0):  # rates 8x either way of the best
        best = max(results, key=lambda lr: statistics.fmean(results[lr]))
        ordered = sorted(results)
        if ordered[-1] < REACH * best:
            train(ordered[-1] * 2)
        elif ordered[0] > best / REACH:
            train(ordered[0] / 2)
        else:
            break
    return dict(sorted(results.items()))


def shown(runs: list[float], regression: bool) -> str:
    mean = statistics.fmean(runs)
    return f"{-mean:.3g}" if regression else f"{mean:.1f}"


@contextlib.contextmanager
def stopping_off(project: common.Project):
    """The finder's divergence test turned off: the sweep runs over the whole range (a loss
    that is not finite still ends it)."""
    finders = sys.modules[f"{common.PACKAGE}.finders"]
    saved = finders.has_diverged
    finders.has_diverged = lambda losses, smoothed: not math.isfinite(smoothed[-1])
    try:
        yield
    finally:
        finders.has_diverged = saved


def sweep(project: common.Project, flags: list[str], out: Path) -> float:
    """Run --find-lr as a user would; the suggested lr. Its lr_find.csv stays in `out`."""
    text = io.StringIO()
    with project.cwd(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        project.train.main([*flags, "--find-lr", "--fresh", "--out-dir", str(out)])
    match = re.search(r"suggested lr (\S+)", text.getvalue())
    if match is None:
        raise SystemExit(f"no suggestion from --find-lr {' '.join(flags)}:\n{text.getvalue()}")
    return float(match.group(1))


def as_rendered(project: common.Project, path: Path) -> float:
    """The suggestion --find-lr makes from a sweep recorded over the whole range: the
    rendered finders.py's own stopping rule (`has_diverged`, step by step) and suggestion
    (`suggest_lr`) applied to its lr_find.csv. Up to where it stops, --find-lr makes the very
    same sweep (same seed, same batches)."""
    finders = sys.modules[f"{common.PACKAGE}.finders"]
    with path.open(newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    lrs, losses, smoothed = ([row[k] for row in rows] for k in ("lr", "loss", "smoothed_loss"))
    steps = range(1, len(rows) + 1)
    end = next((n for n in steps if finders.has_diverged(losses[:n], smoothed[:n])), len(rows))
    return finders.suggest_lr(lrs[:end], smoothed[:end])


def read_sweep(path: Path) -> tuple[list[float], list[float]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [float(r["lr"]) for r in rows], [float(r["loss"]) for r in rows]


def run_task(paths, task: Task, optimizer: str, work: Path, record: Path, options) -> dict:
    """Train the grid and run the sweeps of one task and optimizer; what grid.json keeps."""
    project = common.Project(paths[task.data, optimizer])
    try:
        if task.setup is not None:
            task.setup(project, work)
        flags = task_flags(task, work, options)
        seeds = options.repeats or (1 if options.quick else SEEDS)
        grid = [1 / 4, 1, 4] if options.quick else GRID
        if options.quick:
            flags += ["--find-lr-steps", "30"]
        epochs = 1 if options.quick else task.epochs
        if options.schedule == "default":
            steps: dict[float, list[list[float]]] = {}
            results = train_grid(project, task, flags, work / "run", optimizer, seeds, grid,
                                 epochs, steps)  # fmt: skip
            return {"task": task.name, "optimizer": optimizer, "regression": task.regression,
                    "epochs": epochs, "grid": [[lr, runs] for lr, runs in results.items()],
                    "steps": [[lr, steps[lr]] for lr in results]}  # fmt: skip
        results = train_grid(project, task, flags, work / "run", optimizer, seeds, grid, epochs)
        variants = {"run": []}  # whole-range sweeps: folder, flags
        if project.args(*flags).clip_grad > 0:
            variants["noclip"] = ["--clip-grad", "0"]
        for steps in options.extra_steps:
            variants[f"steps-{steps}"] = ["--find-lr-steps", str(steps)]
        suggestions = []
        for seed in range(seeds):
            name = f"{task.name}-{optimizer}-{seed}"
            seeded = [*flags, "--seed", str(seed)]
            with stopping_off(project):
                for folder, extra in variants.items():
                    sweep(project, [*seeded, *extra], record / folder / name)
            suggestions.append(as_rendered(project, record / "run" / name / "lr_find.csv"))
            if seed == 0:  # --find-lr itself, once: the same suggestion
                found = sweep(project, seeded, record / "rendered" / name)
                if found != suggestions[-1]:
                    raise SystemExit(
                        f"{name}: --find-lr suggested {found}, its rules applied to "
                        f"the whole sweep {suggestions[-1]}: not the same sweep"
                    )
            common.log(f"  {task.name} {optimizer} seed {seed}: suggested {suggestions[-1]:.4g}")
    finally:
        project.close()
    return {"task": task.name, "optimizer": optimizer, "regression": task.regression,
            "epochs": epochs, "grid": [[lr, runs] for lr, runs in results.items()],
            "suggestions": suggestions}  # fmt: skip


def best_lr(entry: dict) -> float:
    return max(entry["grid"], key=lambda item: statistics.fmean(item[1]))[0]


def grid_cell(entry: dict) -> str:
    best = best_lr(entry)
    cells = []
    for lr, runs in entry["grid"]:
        text = f"{lr:.3g}: {shown(runs, entry['regression'])}"
        cells.append(f"**{text}**" if lr == best else text)
    return ", ".join(cells)


def rendered_table(entries: list[dict]) -> tuple[str, bool]:
    rows, ok = [], True
    for e in entries:
        best = best_lr(e)
        ratios = [s / best for s in e["suggestions"]]
        within = all(factor(r) <= TARGET for r in ratios)
        ok &= within
        rows.append(
            [
                e["task"],
                e["optimizer"],
                f"{e['epochs']}",
                grid_cell(e),
                f"{best:.3g}",
                ", ".join(f"{s:.3g}" for s in e["suggestions"]),
                common.ratio_cell(ratios),
                "yes" if within else "no",
            ]
        )
    header = ["task", "optimizer", "epochs",
              "final val acc % (regression: val MSE) by lr, mean of seeds", "grid best lr",
              "suggested lr (seeds)", "suggested / best", "within 2x"]  # fmt: skip
    return common.table(header, rows), ok


VARIANTS = {"run": "clipping as the run's", "noclip": "no clipping"}


def variant_name(folder: str) -> str:
    return VARIANTS.get(folder, folder.replace("steps-", "") + " steps")


def recorded(entries: list[dict], record: Path, folder: str):
    """(entry, lrs, losses) of each whole-range sweep in `folder` (those of LAMB, which clips
    nothing by default, are the run's for `noclip`), cut at the first loss that is not
    finite, where the finder stops whatever its rule."""
    for e in entries:
        for seed in range(len(e["suggestions"])):
            path = record / folder / f"{e['task']}-{e['optimizer']}-{seed}" / "lr_find.csv"
            if not path.is_file():
                path = record / "run" / path.parent.name / path.name
            lrs, losses = read_sweep(path)
            finite = next((i for i, x in enumerate(losses) if not math.isfinite(x)), len(losses))
            yield e, lrs[:finite], losses[:finite]


def stops_table(entries: list[dict], record: Path, folders: list[str]) -> str:
    """How each candidate stopping rule ends the recorded sweeps: too early (before the
    lowest smoothed loss of the whole sweep) or never, and how far past that lowest."""
    rows = []
    for name, stop in STOPS.items():
        row = [name]
        for folder in folders:
            early = never = 0
            past = []
            for _, lrs, losses in recorded(entries, record, folder):
                at, low = stopped(stop, losses), lowest(smooth(losses))
                never += at is None
                early += at is not None and at < low
                past += [] if at is None or at < low else [lrs[at] / lrs[low]]
            cell = f"{early} early, {never} never"
            if past:
                cell += f"; {statistics.median(past):.2g}x ({min(past):.2g}–{max(past):.2g})"
            row.append(cell)
        rows.append(row)
    return common.table(["stop when", *map(variant_name, folders)], rows)


def suggested(rule: Callable, lrs: list[float], losses: list[float]) -> float:
    """What `rule` suggests from a whole-range sweep, stopped where `CHOSEN_STOP` stops it."""
    at = stopped(STOPS[CHOSEN_STOP], losses)
    lrs, losses = (lrs, losses) if at is None else (lrs[: at + 1], losses[: at + 1])
    return rule(lrs, losses, smooth(losses))


def rules_table(entries: list[dict], record: Path, folders: list[str]) -> tuple[str, str]:
    """Each candidate suggestion rule on the recorded sweeps, stopped by the chosen rule: the
    ratio furthest from 1 over every task, optimizer and seed, and how many within 2x."""
    rows, worst_on_run = [], {}
    for name, rule in RULES.items():
        row = [name]
        for folder in folders:
            ratios = []
            for e, lrs, losses in recorded(entries, record, folder):
                ratios.append(suggested(rule, lrs, losses) / best_lr(e))
            worst = max(ratios, key=factor)
            inside = sum(factor(r) <= TARGET for r in ratios)
            row.append(f"{worst:.3g} ({inside} of {len(ratios)})")
            if folder == "run":
                worst_on_run[name] = worst
        rows.append(row)
    best = min(worst_on_run, key=lambda name: factor(worst_on_run[name]))
    table = common.table(["suggest", *map(variant_name, folders)], rows)
    return table, f"{best} (worst {worst_on_run[best]:.3g}, on the sweeps clipped as the run)"


def peak_ratios(entries: list[dict], record: Path, scheduled: list[dict], rule: Callable):
    """Each sweep clipped as the run (task x optimizer x seed), stopped by the chosen rule:
    (entry, the rule's suggestion / the constant grid's best, / the scheduled grid's best,
    the scheduled grid's result at the suggestion)."""
    peaks = {(s["task"], s["optimizer"]): s for s in scheduled}
    for e, lrs, losses in recorded(entries, record, "run"):
        if (e["task"], e["optimizer"]) not in peaks:
            raise SystemExit(f"--scheduled: no grid for {e['task']} with {e['optimizer']}")
        suggestion, peak = suggested(rule, lrs, losses), peaks[e["task"], e["optimizer"]]
        yield e, suggestion / best_lr(e), suggestion / best_lr(peak), at_rate(peak, suggestion)


def at_rate(entry: dict, lr: float) -> float:
    """The grid's mean result at `lr`, interpolated linearly in log lr between its rates
    (that of the nearest end outside them)."""
    points = [(math.log(rate), statistics.fmean(runs)) for rate, runs in entry["grid"]]
    x = min(max(math.log(lr), points[0][0]), points[-1][0])
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            if x in (x0, x1) or not math.isfinite(y0 + y1):
                return y0 if x == x0 else y1 if x == x1 else min(y0, y1)
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[0][1]


def peaks_table(entries: list[dict], record: Path, scheduled: list[dict]) -> str:
    """Each candidate rule against both grids' bests: the ratio furthest from 1 over every
    task, optimizer and seed, how many within 2x, and the median; and what a run with the
    suggestion as its peak would reach, read from the scheduled grid: accuracy points lost
    against the best peak (worst, mean) on the classification tasks, the regression's MSE
    as a multiple of the best (worst)."""
    peaks = {(s["task"], s["optimizer"]): s for s in scheduled}
    rows = []
    for name, rule in RULES.items():
        found = list(peak_ratios(entries, record, scheduled, rule))
        row = [name]
        for grid in ([c for _, c, _, _ in found], [p for _, _, p, _ in found]):
            inside = sum(factor(r) <= TARGET for r in grid)
            worst = max(grid, key=factor)
            row.append(
                f"{worst:.3g} ({inside} of {len(grid)}), median {statistics.median(grid):.3g}"
            )
        lost, mse = [], []
        for e, _, _, value in found:
            peak = peaks[e["task"], e["optimizer"]]
            best = mean_metric(peak, best_lr(peak))
            if e["regression"]:
                mse.append(value / best if math.isfinite(value) else math.inf)
            else:
                lost.append(value - best)
        row.append(f"{min(lost):+.1f}, {statistics.fmean(lost):+.1f}; x{max(mse):.2f}")
        rows.append(row)
    header = ["suggest", "against the constant grid's best", "against the best peak (scheduled)",
              "as the peak: points lost, worst, mean; MSE x best, worst"]  # fmt: skip
    return common.table(header, rows)


def peaks_report(entries: list[dict], record: Path, scheduled: list[dict]) -> list[str]:
    """--scheduled: the paragraphs comparing the rules with the best peaks."""
    return [
        "#### The suggestion as the peak of the default schedule (`--lr auto`)",
        "`--lr auto` makes the suggestion the peak of the run's schedule. Each rule on the "
        "sweeps above (clipped as the run, stopped by the rendered rule), against the "
        "constant grid's best and against the best peak of the same task and optimizer "
        "under the default schedule (the next section's grid, `--schedule default`, mean "
        "of its seeds): the ratio furthest from 1 over every task, optimizer and seed, "
        "how many within 2x, and the median ratio; and what a run with the suggestion as "
        "its peak reaches, read from the scheduled grid (its mean result interpolated "
        "linearly in log lr between its rates): accuracy points against the best peak on "
        "the four classification tasks, worst and mean, and the regression's worst MSE as a "
        "multiple of the best:",
        peaks_table(entries, record, scheduled),
    ]


def common_rates(entries: list[dict]) -> list[float]:
    """The grid rates every task of these entries trained."""
    rates = [{lr for lr, _ in e["grid"]} for e in entries]
    return sorted(set.intersection(*rates))


def mean_metric(entry: dict, lr: float) -> float:
    return next(statistics.fmean(runs) for rate, runs in entry["grid"] if rate == lr)


def shortfall(entry: dict, lr: float) -> str:
    """How far the rate's mean result is from the task's best: accuracy points lost, or the
    regression's MSE as a multiple of the best."""
    best = mean_metric(entry, best_lr(entry))
    value = mean_metric(entry, lr)
    if entry["regression"]:
        return f"x{value / best:.2f}" if math.isfinite(value) else "inf"
    return f"{value - best:+.1f}"


def ranks(entry: dict, rates: list[float]) -> dict[float, float]:
    """Each rate's rank among `rates` on this task (1: the best), ties sharing the mean."""
    values = {lr: mean_metric(entry, lr) for lr in rates}
    return {lr: 1 + sum(v > values[lr] for v in values.values())
            + (sum(v == values[lr] for v in values.values()) - 1) / 2 for lr in rates}  # fmt: skip


def defaults_table(entries: list[dict], optimizer: str) -> tuple[str, float, float]:
    """The rates every task trained, each with its result on each task against the task's
    best and its mean rank over the tasks: the table, the rate of the best mean rank and the
    rate whose worst accuracy lost (classification tasks) is the least."""
    chosen = [e for e in entries if e["optimizer"] == optimizer]
    rates = common_rates(chosen)
    task_ranks = [ranks(e, rates) for e in chosen]
    mean_rank = {lr: statistics.fmean(r[lr] for r in task_ranks) for lr in rates}
    worst = {
        lr: max(mean_metric(e, best_lr(e)) - mean_metric(e, lr)
                for e in chosen if not e["regression"])
        for lr in rates
    }  # fmt: skip
    best_rank = min(rates, key=lambda lr: (mean_rank[lr], worst[lr]))
    best_worst = min(rates, key=lambda lr: (worst[lr], mean_rank[lr]))
    rows = []
    for lr in rates:
        row = [f"**{lr:.3g}**" if lr == best_rank else f"{lr:.3g}"]
        row += [shortfall(e, lr) for e in chosen]
        row += [f"{mean_rank[lr]:.1f}", f"{-worst[lr]:+.1f}"]
        rows.append(row)
    header = ["peak lr", *(e["task"] for e in chosen), "mean rank", "worst (classification)"]
    return common.table(header, rows), best_rank, best_worst


def hint_constants() -> dict[str, float]:
    """HINT_STEPS, FLAT and RISEN as the template's schedule.py sets them."""
    text = (common.ROOT / "template" / "{{package_name}}" / "schedule.py.jinja").read_text()
    found = re.findall(r"^(HINT_STEPS|FLAT|RISEN) = ([0-9.]+)", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def hint(losses: list[float], epochs: int, constants: dict[str, float]) -> str | None:
    """schedule.py's LrHint on a run's step losses: "low", "high" or None. It reads them at
    the end of the first epoch that ends 2 x HINT_STEPS steps or more into the run."""
    steps, per_epoch = int(constants["HINT_STEPS"]), len(losses) // epochs
    end = next((n for n in range(per_epoch, len(losses) + 1, per_epoch) if n >= 2 * steps), None)
    if end is None:
        return None
    first = statistics.fmean(losses[:steps])
    last = statistics.fmean(losses[end - steps : end])
    epoch_loss = statistics.fmean(losses[end - per_epoch : end])
    if not first > 0:
        return None
    if last > constants["RISEN"] * first:
        return "high"
    if abs(last - first) < constants["FLAT"] * first and last < epoch_loss:
        return "low"
    return None


def hint_class(lr: float, best: float) -> str:
    """How far a grid rate is from its task's best (the grid's rates are powers of 2 apart)."""
    doublings = round(math.log2(lr / best))
    if abs(doublings) <= 1:
        return "within 2x of the best"
    if abs(doublings) < 3:
        return "between (4x either way)"
    return f"8x or more {'below' if doublings < 0 else 'above'} the best"


def hint_table(entries: list[dict]) -> str:
    """How the hint reads every grid run, by how far its rate is from the task's best."""
    constants = hint_constants()
    names = ["8x or more below the best", "within 2x of the best", "8x or more above the best",
             "between (4x either way)"]  # fmt: skip
    counts = {name: {"low": 0, "high": 0, None: 0} for name in names}
    for e in entries:
        for lr, seeds in e["steps"]:
            for losses in seeds:
                counts[hint_class(lr, best_lr(e))][hint(losses, e["epochs"], constants)] += 1
    rows = [[name, str(sum(c.values())), str(c["low"]), str(c["high"]), str(c[None])]
            for name, c in counts.items()]  # fmt: skip
    header = ["grid rate", "runs", "says too low", "says too high", "silent"]
    return common.table(header, rows)


def scheduled_report(entries: list[dict]) -> str:
    """--schedule default: the grid, and the rate that does best across the tasks."""
    title = "### Default learning rates: a trained grid under the default schedule"
    seeds = len(entries[0]["grid"][0][1])
    rows = [[e["task"], e["optimizer"], str(e["epochs"]), grid_cell(e), f"{best_lr(e):.3g}"]
            for e in entries]  # fmt: skip
    metric = "final val acc % (regression: val MSE) by peak lr, mean of seeds"
    header = ["task", "optimizer", "epochs", metric, "best"]
    parts = [
        title,
        f"Each grid rate trained from {seeds} seeds for the epochs shown under the run's "
        "default schedule (`warmup_cosine`: a linear warmup over the first epoch, then a "
        "cosine down to a hundredth of the peak), the run's other defaults as in the "
        "section above; the best rate (bold) has the best mean final validation accuracy "
        "(regression: the lowest mean validation MSE).",
        common.table(header, rows),
        "Each optimizer's rates that every task trained: accuracy points against the task's "
        "best (regression: its MSE as a multiple of the best), the mean rank over the five "
        "tasks (1: the best on every task; ties share), and the worst loss of accuracy over "
        "the four classification tasks. Bold: the best mean rank.",
    ]
    for optimizer in dict.fromkeys(e["optimizer"] for e in entries):
        table, best_rank, best_worst = defaults_table(entries, optimizer)
        parts += [
            f"{optimizer}: best mean rank {best_rank:.3g}, smallest worst case {best_worst:.3g}",
            table,
        ]
    constants = hint_constants()
    parts += [
        "The hint of a learning rate far off (schedule.py's `LrHint`), on every grid run's "
        "training losses: the mean of the first "
        f"{constants['HINT_STEPS']:g} optimizer steps against that of the last "
        f"{constants['HINT_STEPS']:g} of the first epoch (here each has 32 to 62 steps): too "
        f"high if it ends above {constants['RISEN']:g} times its start, too low if it moved by "
        f"less than {constants['FLAT']:.0%} either way and ends below the epoch's mean (still "
        "falling). "
        "Each run is counted (task x optimizer x seed), by how far its rate is from its "
        "task's best:",
        hint_table(entries),
    ]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    parser = common.parser(__doc__)
    parser.add_argument("--record", type=Path, default=None, help="default: build/lr_finder")
    parser.add_argument(
        "--schedule", choices=("constant", "default"), default="constant",
        help="the grid's schedule: constant, or the run's default (no sweeps)",
    )  # fmt: skip
    parser.add_argument("--offline", type=Path, default=None, help="a record to compare again")
    parser.add_argument(
        "--scheduled", type=Path, default=None,
        help="a --schedule default record: the rules against its best peaks too",
    )  # fmt: skip
    parser.add_argument("--tasks", nargs="*", default=None, help="only these tasks")
    parser.add_argument("--optimizers", nargs="*", default=None, help="only these optimizers")
    parser.add_argument(
        "--extra-steps", type=int, nargs="*", default=[], help="also record sweeps this long"
    )
    options = parser.parse_args(argv)
    title = "### LR finder: the suggestion against a trained grid of constant learning rates"
    if options.project is not None:  # a machine without Copier
        return f"{title}\n\nNot run: it renders projects of its own, which --project cannot give."
    tasks = [t for t in TASKS if not options.tasks or t.name in options.tasks]
    optimizers = [o for o in OPTIMIZERS if not options.optimizers or o in options.optimizers]
    if options.quick:
        optimizers = options.optimizers or ["sgd", "adamw"]
        options.extra_steps = []
    if options.record is None:
        name = "lr_finder" if options.schedule == "constant" else "lr_finder-scheduled"
        options.record = common.ROOT / "build" / name
    record = (options.offline or options.record).resolve()  # runs change the working folder
    if options.offline is None:
        if record.is_dir() and any(record.iterdir()) and not (record / "grid.json").is_file():
            parser.error(f"--record {record}: not empty, and not a record of this benchmark")
        shutil.rmtree(record, ignore_errors=True)
        record.mkdir(parents=True)
        entries = []
        with common.workdir(options.keep) as work:
            datas = sorted({t.data for t in tasks})
            paths = render_projects(work, optimizers, datas, options.schedule)
            for task in tasks:
                for optimizer in optimizers:
                    entries.append(run_task(paths, task, optimizer, work, record, options))
                    (record / "grid.json").write_text(json.dumps(entries, indent=1))
    entries = json.loads((record / "grid.json").read_text())
    if "steps" in entries[0]:
        return scheduled_report(entries)
    folders = sorted(
        (p.name for p in record.iterdir() if p.is_dir() and p.name != "rendered"),
        key=lambda name: (name != "run", name != "noclip", name),
    )
    table, ok = rendered_table(entries)
    rules, best_rule = rules_table(entries, record, folders)
    seeds = len(entries[0]["suggestions"])
    peaks = []
    if options.scheduled is not None:
        scheduled = json.loads((options.scheduled.resolve() / "grid.json").read_text())
        peaks = peaks_report(entries, record, scheduled)
    return "\n\n".join(
        [
            title,
            f"Each grid rate trained from {seeds} seeds for the epochs shown, no schedule; the "
            "best rate (bold) has the best mean final validation accuracy (regression: the "
            f"lowest mean validation MSE). `--find-lr` as rendered, from the same {seeds} seeds "
            "(its own stopping and suggestion rules applied to the sweep recorded over the "
            "whole range, which is its sweep up to where it stops; on the first seed "
            "`--find-lr` itself ran too, and suggested the same); the ratio is each "
            "suggestion / the grid's best, median (min–max).",
            table,
            common.verdict(ok, f"every suggestion within {TARGET:g}x of the grid's best"),
            "Candidate rules, on the same sweeps run again over the whole range (1e-7 to 10) "
            "with the stopping rule turned off: with the run's gradient clipping, without it, "
            "and shorter. Where each stopping rule would have stopped them (early: before the "
            "sweep's lowest smoothed loss; then how far past it, in lr, median (min–max)):",
            stops_table(entries, record, folders),
            f"Each suggestion rule on the sweeps as `{CHOSEN_STOP}` stops them: the "
            "suggested / best ratio furthest from 1 over every task, optimizer and seed, and "
            "how many were within 2x:",
            rules,
            f"Best candidate: {best_rule}.",
            *peaks,
        ]
    )


if __name__ == "__main__":
    print(main())
