"""Where the rendered loop's per-step overhead goes, on the overhead-dominated workload.

    python bench/overhead_breakdown.py [--quick] [--repeats N]

An experiment, not a change to the template: the default project is rendered (with the
extras guard and device_data), and copies of its train.py are written next to it with one
piece of per-step machinery taken out of the training step each (the lines become `pass`,
or `if True:` for a `with` block). Each
copy trains the tiny MLP (8x8 images, data on device, batch 128, CPU, 0 workers) in this
process, side by side with the bare loop of bench/bare_loop.py: one epoch of each in turn
(bare_loop.paired_epochs), the first epoch left out as warm-up. Each row is the median over
its pairs of the copy's throughput over the bare loop's, so the rows compare through the
bare loop measured next to each of them, not through absolute times taken minutes apart.

Pieces (each removed alone, then all together):
  guard     NonFiniteGuard: start_window / before_step / after_step (copies of the
            weights and buffers, masked gradients, a torch.where per tensor)
  autocast  the `with parts.autocast():` block around the forward pass (a nullcontext when amp
            resolves to off, as on a CPU)
  nonfinite the per-micro-batch non-finite flag (two small kernels, a maximum over the
            window); a constant flag made once stands in
  meters    the losses (and terms) kept for the epoch's means
and, added rather than removed, the tqdm bar drawn as in a terminal (train.py turns it off
when stderr is not a terminal, as in these benchmarks).
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_loop  # noqa: E402
import common  # noqa: E402

# piece: [(line as rendered, stripped; what replaces it, same indentation)]
PIECES = {
    "guard": [
        ("parts.guard.start_window()", "pass"),
        ("parts.guard.before_step()", "pass"),
        ("parts.guard.after_step()", "pass"),
    ],
    "autocast": [("with parts.autocast():", "if True:")],
    "nonfinite": [("parts.guard.add(loss)", "parts.guard.bad = NO_BAD_STEP")],
    "meters": [("parts.metrics.add(loss, terms)", "pass")],
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
    """train.py with these pieces taken out of the training step; None if one is not found."""
    head, sep, rest = source.partition("\ndef train_one_epoch(")
    lines = rest.split("\n")  # train_one_epoch and the step functions after it
    for piece in pieces:
        found = False
        for old, new in PIECES[piece]:
            for n, line in enumerate(lines):
                if line.strip() == old:
                    lines[n] = line[: len(line) - len(line.lstrip())] + new
                    found = True
        if not found:
            return None
    head += "\n\nNO_BAD_STEP = torch.zeros(())  # for the copy without the non-finite flag\n"
    return head + sep + "\n".join(lines)


def variant_module(project: common.Project, name: str, source: str, tqdm_on: bool = False):
    """Import `source` as module `name` from the project folder."""
    (project.path / f"{name}.py").write_text(source)
    with project.cwd():
        module = importlib.import_module(name)
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
    pairs = options.repeats or (3 if options.quick else 40)
    size = "2048" if options.quick else "5120"
    flags = [
        *["--device", options.device, "--workers", "0", "--batch-size", "128", "--seed", "0"],
        *["--amp", "off"],  # float32, like the bare loop
        *["--model", "mlp", "--image-size", "8", "--data-on-device", "on"],
        *["--synthetic-size", size, "--epochs", str(pairs + 1)],
    ]
    ratios: dict[str, list[float]] = {}
    bare_speeds: list[float] = []
    with common.workdir(options.keep) as work:
        common.log("overhead breakdown: preparing the default project")
        project = common.default_project(options, work)
        try:
            source = (project.path / "train.py").read_text()
            modules = {
                "rendered": project.train,
                "tqdm": variant_module(project, "train_tqdm", source, tqdm_on=True),
            }
            for key in ("guard", "autocast", "nonfinite", "meters", "all"):
                pieces = list(PIECES) if key == "all" else [key]
                variant = edited(source, pieces)
                if variant is None:
                    common.log(f"  {key}: lines not found in train.py, left out")
                    continue
                modules[key] = variant_module(project, f"train_{key}", variant)
            for key, module in modules.items():
                measured = bare_loop.paired_epochs(
                    project, flags, work / "runs" / key, module=module
                )
                ratios[key] = [r / b for r, b in measured]
                bare_speeds += [b for _, b in measured]
                common.log(f"  {key}: {LABELS[key]}, vs bare {statistics.median(ratios[key]):.3f}")
        finally:
            project.close()

    bare_us = 128 / statistics.median(bare_speeds) * 1e6
    rendered = statistics.median(ratios["rendered"])
    rows = []
    for key, label in LABELS.items():
        if key == "bare":
            rows.append([label, f"{bare_us:.0f}", "1.000", ""])
        elif key not in ratios:
            rows.append([label, "n/a", "", ""])
        else:
            ratio = statistics.median(ratios[key])
            delta = "" if key == "rendered" else f"{ratio - rendered:+.3f}"
            rows.append([label, f"{bare_us / ratio:.0f}", common.ratio_cell(ratios[key]), delta])
    text = "\n\n".join(
        [
            "### Where the rendered loop's overhead goes (tiny MLP, data on device)",
            f"Each loop against the bare loop, one epoch of each in turn, {pairs} pairs per "
            "loop: median throughput ratio (min–max in brackets), 'vs rendered' what taking "
            "the piece out (or drawing the bar) changes that ratio. µs / step is the bare "
            "loop's median step time over the ratio, for scale.",
            common.table(["loop", "µs / step", "throughput / bare", "vs rendered"], rows),
            f"Rendered overhead over the bare loop: {bare_us / rendered - bare_us:.0f} µs per step "
            f"({1 - rendered:.1%} of the bare loop's throughput).",
        ]
    )
    return text


if __name__ == "__main__":
    print(main())
