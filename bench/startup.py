"""Start-up: the time from `python train.py` to its first optimizer step, against a bare
script that imports what a hand-written loop imports and takes one step.

    python bench/startup.py [--quick] [--repeats N] [--keep DIR]

Both sides are new interpreters started by this script, whose clock runs from the start of
the process to its exit. Each side ends itself at its first optimizer step (a hook that
torch calls after every step), so only what comes before the first step is measured:
imports, flag parsing, building the data set and the model, seeding, the checks, the first
step. The bare side is the loop a user would write around the project's own pieces: it
parses the same flags, builds the same data set and model with the project's functions,
takes the first batch from a plain DataLoader and one plain SGD step. What train.py adds
is then its own start-up: the checks, the seeding, the loaders, the output folder. They run
in pairs, the order alternating (common.interleave); the table shows the rendered / bare
time.

Projects: the default answers (images, the built-in synthetic set) and `data: tensors`
(the built-in signals), each with `--workers 0` and a small --synthetic-size so that
building the data set costs what a small one costs.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

STOP_AT_FIRST_STEP = (
    "import os, torch; from torch.optim.optimizer import register_optimizer_step_post_hook; "
    "register_optimizer_step_post_hook(lambda *_: os._exit(0)); "
)
TRAIN = "import runpy, sys; sys.argv = ['train.py', *sys.argv[1:]]; " + (
    "runpy.run_path('train.py', run_name='__main__')"
)
BARE = (
    "import sys, train; from torch.utils.data import DataLoader; "
    "from proj.data import build_dataset; from proj.models import build_model; "
    "args = train.get_args_parser().parse_args(sys.argv[1:]); "
    "train_set, _, info = build_dataset(args); model = build_model(args.model, info); "
    "inputs, targets = next(iter(DataLoader(train_set, batch_size=args.batch_size))); "
    "opt = torch.optim.SGD(model.parameters(), lr=0.1); "
    "torch.nn.functional.cross_entropy(model(inputs.float()), targets).backward(); opt.step()"
)
FLAGS = ["--epochs", "1", "--workers", "0", "--synthetic-size", "512", "--fresh"]


def seconds(code: str, cwd: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", STOP_AT_FIRST_STEP + code, *args],
        cwd=cwd,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    options = common.parser(__doc__).parse_args(argv)
    repeats = options.repeats or (1 if options.quick else 5)
    rows, worst = [], -math.inf
    with common.workdir(options.keep) as work:
        for label, answers in (
            ("defaults (images)", {"extras": ["preemption"]}),
            ("data: tensors", {"data": "tensors", "extras": ["preemption"]}),
        ):
            project = common.render(work / label.split()[0].strip(":"), **answers)
            flags = [*FLAGS, "--out-dir", str(work / "runs"), "--device", options.device]
            pairs = common.interleave(
                lambda: seconds(TRAIN, project, *flags),  # noqa: B023 (called at once)
                lambda: seconds(BARE, project, *flags),  # noqa: B023
                repeats,
                label,
            )
            ratios = [a / b for a, b in pairs]
            rendered = statistics.median(a for a, _ in pairs)
            bare = statistics.median(b for _, b in pairs)
            rows.append([label, f"{rendered:.2f}", f"{bare:.2f}", common.ratio_cell(ratios)])
            worst = max(worst, rendered - bare)
    print("## Start-up: `python train.py` to its first step\n")
    header = ["project", "train.py to step 1 (s)", "bare script (s)", "train.py / bare"]
    print(common.table(header, rows))
    print(f"\nThe most train.py adds before its first step (median): {worst:+.2f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
