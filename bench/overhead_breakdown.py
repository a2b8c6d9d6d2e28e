"""Where the rendered loop's per-step overhead goes, on the overhead-dominated workload.

    python bench/overhead_breakdown.py [--quick] [--repeats N]

An experiment, not a change to the template: the default project is rendered, and copies
of its train.py are written next to it with one piece of per-step machinery taken out of
train_one_epoch each (the lines become `pass`, or `if True:` for a `with` block). Each
copy trains the tiny MLP (8x8 images, data on device, batch 128, CPU, 0 workers) in this
process, and the time of each train_one_epoch call is divided by its steps. The bare loop
of bench/bare_loop.py is the floor. Runs rotate their order from one repeat to the next;
the table shows medians over repeats, the first epoch of each run left out as warm-up.

Pieces (each removed alone, then all together):
  guard     NonFiniteGuard: start_window / before_step / after_step (copies of the
            weights and buffers, masked gradients, a torch.where per tensor)
  autocast  the `with run["autocast"]():` block around the forward pass (a nullcontext
            when amp resolves to off, as on a CPU)
  nonfinite the per-step non-finite flag (isfinite) and its list for the epoch's sums
  meters    the per-step list of losses for the epoch's sums
and, added rather than removed, the tqdm bar drawn as in a terminal (train.py turns it off
when stderr is not a terminal, as in these benchmarks).
"""

from __future__ import annotations

import functools
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_loop  # noqa: E402
import common  # noqa: E402

# piece: [(line as rendered, stripped; what replaces it, same indentation)]
PIECES = {
    "guard": [
        ('run["guard"].start_window()', "pass"),
        ('run["guard"].before_step(window_bad)', "pass"),
        ('run["guard"].after_step(window_bad)', "pass"),
    ],
    "autocast": [('with run["autocast"]():', "if True:")],
    "nonfinite": [
        (
            "bad = torch.isfinite(loss.detach()).logical_not_()",
            "bad = window_bad = torch.zeros((), dtype=torch.bool)",
        ),
        ("window_bad = bad", "pass"),
        ("window_bad = window_bad | bad", "pass"),
        ('pending["bad"].append(window_bad)', "pass"),
    ],
    "meters": [('pending["losses"].append((loss.detach(), targets.numel()))', "pass")],
}
LABELS = {
    "rendered": "rendered train.py as is",
    "tqdm": "+ tqdm bar drawn (a terminal)",
    "guard": "− NonFiniteGuard",
    "autocast": "− autocast block (a nullcontext when amp is off)",
    "nonfinite": "− non-finite bookkeeping",
    "meters": "− loss and sample meters",
    "all": "− all four",
    "bare": "bare loop (bench/bare_loop.py)",
}


def edited(source: str, pieces: list[str]) -> str | None:
    """train.py with these pieces taken out of train_one_epoch; None if one is not found."""
    head, sep, rest = source.partition("\ndef train_one_epoch(")
    body, sep2, tail = rest.partition("\ndef ")
    lines = body.split("\n")
    for piece in pieces:
        found = False
        for old, new in PIECES[piece]:
            for n, line in enumerate(lines):
                if line.strip() == old:
                    lines[n] = line[: len(line) - len(line.lstrip())] + new
                    found = True
        if not found:
            return None
    # Without the sample meter the epoch's train loss would divide by zero.
    tail = tail.replace("loss_sum / seen", "loss_sum / max(seen, 1)")
    return head + sep + "\n".join(lines) + sep2 + tail


def timed_module(project: common.Project, name: str, source: str | None, tqdm_on: bool = False):
    """Import `source` as module `name` from the project folder; its train_one_epoch
    records (seconds, steps) per call in module.timings."""
    import torch

    if source is not None:
        (project.path / f"{name}.py").write_text(source)
    with project.cwd():
        module = importlib.import_module(name)
    module.timings = []
    inner = module.train_one_epoch

    @functools.wraps(inner)
    def train_one_epoch(model, loader, *args, **kwargs):
        steps = len(loader)
        start = time.perf_counter()
        inner(model, loader, *args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        module.timings.append((time.perf_counter() - start, steps))

    module.train_one_epoch = train_one_epoch
    if tqdm_on:
        null = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the module
        original = module.tqdm

        def drawn(*args, **kwargs):
            kwargs.update(disable=False, file=null)
            return original(*args, **kwargs)

        module.tqdm = drawn
    return module


def main(argv: list[str] | None = None) -> str:
    options = common.parser(__doc__).parse_args(argv)
    repeats = options.repeats or (1 if options.quick else 3)
    size = "4096" if options.quick else "50000"
    epochs = "2" if options.quick else "3"
    flags = [
        *["--device", options.device, "--workers", "0", "--batch-size", "128", "--seed", "0"],
        *["--amp", "off"],  # float32, like the bare loop
        *["--model", "mlp", "--image-size", "8", "--data-on-device", "on"],
        *["--synthetic-size", size, "--epochs", epochs],
    ]
    per_step: dict[str, list[float]] = {key: [] for key in LABELS}
    with common.workdir(options.keep) as work:
        common.log("overhead breakdown: preparing the default project")
        project = common.default_project(options, work)
        try:
            source = (project.path / "train.py").read_text()
            modules = {
                "rendered": timed_module(project, "train", None),
                "tqdm": timed_module(project, "train_tqdm", source, tqdm_on=True),
            }
            for key in ("guard", "autocast", "nonfinite", "meters", "all"):
                pieces = list(PIECES) if key == "all" else [key]
                variant = edited(source, pieces)
                if variant is None:
                    common.log(f"  {key}: lines not found in train.py, left out")
                    continue
                modules[key] = timed_module(project, f"train_{key}", variant)
            keys = [*modules, "bare"]
            for r in range(repeats):
                order = keys[r % len(keys) :] + keys[: r % len(keys)]
                for key in order:
                    if key == "bare":
                        speeds = bare_loop.train(project, project.args(*flags))
                        value = 128 / statistics.harmonic_mean(speeds[1:]) * 1e6
                    else:
                        module = modules[key]
                        module.timings.clear()
                        with project.cwd(), common.silenced():
                            module.main([*flags, "--out-dir", str(work / "runs" / key), "--fresh"])
                        later = module.timings[1:]
                        value = sum(t for t, _ in later) / sum(s for _, s in later) * 1e6
                    per_step[key].append(value)
                common.log(
                    f"  repeat {r + 1}/{repeats}: "
                    + ", ".join(f"{k} {v[-1]:.0f} us" for k, v in per_step.items() if v)
                )
        finally:
            project.close()

    med = {k: statistics.median(v) for k, v in per_step.items() if v}
    bare, rendered = med["bare"], med["rendered"]
    rows = []
    for key, label in LABELS.items():
        if key not in med:
            rows.append([label, "n/a", "", ""])
            continue
        delta = "" if key in ("rendered",) else f"{med[key] - rendered:+.0f}"
        rows.append([label, f"{med[key]:.0f}", delta, f"{med[key] / bare:.3f}"])
    text = "\n\n".join(
        [
            "### Where the rendered loop's overhead goes (tiny MLP, data on device)",
            f"Microseconds per training step, medians of {repeats} rotated repeats; "
            "'vs rendered' is what adding or removing the piece changes, 'vs bare' the step "
            "time over the bare loop's (rendered / bare throughput is its inverse).",
            common.table(["loop", "µs / step", "vs rendered", "vs bare"], rows),
            f"Rendered overhead over the bare loop: {rendered - bare:.0f} µs per step "
            f"({(rendered - bare) / rendered:.0%} of the rendered step).",
        ]
    )
    return text


if __name__ == "__main__":
    print(main())
