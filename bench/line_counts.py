"""Lines of Python outside tests/ in rendered projects, counted as `wc -l` counts them (blank
lines and comments included), for four answer sets: the smallest recipe (with images, and
with your own tensors), the defaults, and everything chosen. Prints a markdown section
(make bench puts it in bench/RESULTS.md); the test suite holds the same figures to their
ceilings (tests/test_line_budgets.py).

    python bench/line_counts.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import copier
import yaml

ROOT = Path(__file__).resolve().parents[1]
EVERY_EXTRA = ["preemption", "device_data", "guard", "finders", "ema", "tensorboard"]
EVERY_EXTRA += ["speed_report"]
ANSWER_SETS = {
    "examples/cpu-minimal.yml": yaml.safe_load((ROOT / "examples/cpu-minimal.yml").read_text()),
    "examples/cpu-minimal.yml with data: tensors": {
        **yaml.safe_load((ROOT / "examples/cpu-minimal.yml").read_text()),
        "data": "tensors",
    },
    "defaults": {},
    "everything (ddp, fp16, lamb, onecycle, every extra)": {
        "distributed": "ddp",
        "amp": "fp16",
        "optimizer": "lamb",
        "scheduler": "onecycle",
        "extras": EVERY_EXTRA,
    },
}
# The budgets the project set itself (issue 15's 900 and 2,200, then issue 28's): all Python
# outside tests/, and train.py.
BUDGETS = {
    "examples/cpu-minimal.yml": (1200, 300),
    "examples/cpu-minimal.yml with data: tensors": (1200, 300),
    "defaults": (1300, None),
    "everything (ddp, fp16, lamb, onecycle, every extra)": (2300, None),
}
# What the tests hold each answer set to: its budget where it is met, else the figures of
# v0.10.0 (v0.9.0's plus issue 25's guarantees: metrics history, preemption with loader
# workers, --eval-only's weights, checks of the user's data, refusals of contradictory flags),
# and issue 27's: determinism switched only when it changes (a line in every project), the
# in-memory path of data: tensors (whole batches indexed from its tensors, 32 lines), the LR
# finder's divergence rule (14 lines with its floor, in everything), the hint of a learning
# rate far off (53 lines in every project, 3 of them in train.py), and leaving the process
# group at exit when a script calls main() (3 lines in DDP projects); and issue 28's step in
# one function (train_step) with the loop's state in two dataclasses (Parts, Run) instead of
# fit's ten parameters: 3 lines in train.py; the loss seam's named terms, logged per epoch
# (metrics.py's TrainMetrics in place of checkpoint.py's EpochSums: 25 lines, 2 in train.py);
# the best val_acc kept by the loop, not by collapse_note (2 lines in train.py, 1 fewer in
# logger.py). Fused SGD's momentum zeroing only where a step can be skipped: 8 fewer.
# Issue 30's speed report, an extra and so in everything alone: speed.py (498 lines) and its
# flags in train.py (28).
# Issue 27's batch of a short run (data.py's short_run_batch and its constants, 26 lines;
# 11 in train.py, 8 of them the import it makes wrap), where the answer is 64 or more;
# single-process renders without DDP's traces (val_sampler, layout, own): 2 fewer; tqdm's
# monitor thread turned off (it could hang a loader worker forked as it started): 3 in train.py.
# Checkpoints of v0.6.0 and before (format 1) refused in one line instead of upgraded: 23 fewer.
# v0.17.0's fixes of what trying the loop as users do found (54 lines in the smallest, 7 of
# them in train.py): a restarted or requeued job goes on from its own last.pt (utils.py's
# restarted_job, and 2 lines in train.py); a resume with other batches goes on from the same
# epoch of the schedule (schedule.py's move_to, and 5 in train.py); NaN inputs refused in
# every batch, a std that is not positive, fewer than 2 classes and a missing validation set
# refused, hidden folders no classes (data.py: 26); metrics.csv one row past the checkpoint
# is the run's own (logger.py: 4); checkpoints written with the umask's mode.
# v0.18.0: a model that does not fit the data's inputs refused in one line before training
# (models.py's model_problem, 12 lines, and 2 in train.py); --eval-only takes no lock (a
# comment in train.py); less a line of the out-dir's cleanup. A restarted job goes on only
# from its own last.pt: checkpoint.py's job_id and the job in each checkpoint (10 lines where
# torchrun or the preemption extra are). A scheduler's notice while the run starts is kept
# for preemption (preemption.py's holding_signals, 25 lines, and 2 in train.py); fp16's
# schedule counts the scaler's skips (2 fewer); in everything also --lr auto refuses a guess
# (finders.py: 10), --eval-only reports the EMA (train.py: 3), and the speed report lists a
# speed-up the data cannot take. metrics.csv written after the epoch's checkpoints (a run
# stopped at a save adds no row): 3 lines, 1 in train.py. The model check leaves the model
# in its mode (3).
# v0.19.0: a resume goes on with the checkpoint's held flags (--lr, the optimizer's and the
# schedule's, --seed) that the command leaves out, instead of refusing their defaults
# (utils.py's ArgumentParser.given, checkpoint.py's keep_state_flags: 18 lines, 3 in train.py);
# a torchrun job's processes all stop when the out-dir is in use (1 line where torchrun is);
# a missing tensorboard package is one line, imported where the writer is made (2); under
# scripts/launch.sh a Ctrl-C before training began is noted for the processes (preemption.py: 7);
# the guard knows a resumed run has had updates (2). DataInfo.dtype: token ids reach an
# embedding as they are (6 lines in every project); the validation loader's own generator,
# for an exact resume with loader workers and dropout (2); googlenet and inception_v3 built
# without side heads (3, where images are); compute_loss's terms may be numbers (1); the lr
# hint after --lr auto names a rate to try, not the sweep (2, where the finders are); --help
# gives each flag's default (utils.py's HelpFormatter: 10, 2 fewer in train.py).
# v0.20.0: metrics.csv's lr is the rate of the epoch's last step, not the one the schedule set
# after it (Progress.lr: 1 line in train.py, 1 in checkpoint.py); --eval-only without --batch-
# size takes the answer's batch, not the short-run rule's (1, where that rule is); a
# checkpoint that does not fit --model names the model it was made with (2); --amp fp16 on a
# CPU says it is slow (2, where fp16 is). Schedules that end where they promise: the default
# warmup is an epoch, at most half the schedule (5 lines in schedule.py where there is
# warmup); cosine_restarts' default is two cycles filling the run, cyclic's a whole number of
# cycles; 1cycle and cyclic cycle the momentum down from --momentum or --beta1 (3), and a
# cyclic run resumed with other steps per epoch is refused as 1cycle's is. Under torchrun, a
# validation set with fewer items than processes is refused in one line (5: it hung DDP and
# crashed FSDP); a process whose peer has gone says so in one line, not gloo's traceback, and
# error lines are written whole (6 in train.py). A fresh run moves an earlier run's
# TensorBoard events aside (6, where TensorBoard is). A resume whose --epochs stops before the
# schedule's end says so (2). A 1cycle run too short for its --pct-start rises over two steps
# and still ends at its final rate (3, where 1cycle is). Data too small for any batch of a
# short run goes straight to train.py's check, which names the batch that fits (2, where that
# rule is). The logger names its decision that metrics.csv is another run's (1): TensorBoard's
# events follow it, so a run resumed in its first epoch keeps its own.
# v0.21.0: a resumed run writes its checkpoint's rows to TensorBoard again, as far apart in
# time as their elapsed_s, so a run stopped between a checkpoint and its events misses no
# point (10, where TensorBoard is); the batch of a short run suggests keeping the answer's
# batch only where the data holds one, and says "1 epoch" (2, where that rule is); "rank N:"
# only under torchrun (1, where torchrun is); a refusal of a part-way checkpoint under 1cycle
# or cyclic no longer says an epoch's end takes any (1 fewer where those are). What trying
# the project in odd environments found: a file of weights alone given to --resume is refused
# in one line (checkpoint.py: 4); a file system without locks runs with a note instead of
# refusing every run as in use (utils.py: 4); output reaches a log file a line at a time,
# and an epoch's line comes after its checkpoints, also when they fail (train.py: 4).
# v0.21.1: at the end of a run, when preempted and when its --out-dir is refused, a process
# waits for the others before it exits (a barrier as the last collective: gloo could abort a
# process that exited straight after one; 11, where torchrun is).
# A save that fails says the file system's reason, and whether an earlier checkpoint stays
# (checkpoint.py: 2); an --out-dir that links to a removed folder says so (utils.py: 3); a
# full /dev/shm is named, with what to do, not blamed on the items (data.py: 6); a resumed
# run says how many epochs were done, as a stopped one names the epoch under way (1).
# v0.21.2: what trying the template with data and models of kinds no test had found: one-
# line refusals of data the loop cannot take and of a named pipe in an image folder (data.py:
# 19; 15 with data: tensors), loss terms the same on every batch (metrics.py: 11; 13 where
# torchrun is), model outputs not num_classes wide and the model's check in channels_last
# (models.py: 10; 5), a resume with other parameters frozen (checkpoint.py: 6), an --out-dir
# below a dangling link (utils.py: 2), the guard's streak across a resume (guard.py: 7) and
# fp16's skipped steps named on the epoch line (2, where fp16 is).
# The README's "Line budgets" says what the lines above the budgets are for.
CEILINGS = {
    "examples/cpu-minimal.yml": (1833, 351),
    "examples/cpu-minimal.yml with data: tensors": (1617, 340),
    "defaults": (1981, None),
    "everything (ddp, fp16, lamb, onecycle, every extra)": (3573, None),
}


def count(project: Path) -> dict[str, int]:
    """Lines of each Python file outside tests/, by path relative to the project."""
    lines = {}
    for path in sorted(project.rglob("*.py")):
        relative = path.relative_to(project)
        if relative.parts[0] != "tests":
            lines[str(relative)] = len(path.read_bytes().splitlines())
    return lines


def render(answers: dict, dest: Path, source: Path = ROOT) -> Path:
    """Render `source` (this checkout, uncommitted edits included) with `answers`."""
    data = dict(answers)
    ref = {"vcs_ref": "HEAD"} if (source / ".git").exists() else {}
    copier.run_copy(str(source), dest, data=data, defaults=True, unsafe=True, quiet=True, **ref)
    return dest


def measure(source: Path = ROOT) -> dict[str, dict[str, int]]:
    """Lines by file of each answer set's render."""
    with tempfile.TemporaryDirectory() as tmp:
        return {
            name: count(render(answers, Path(tmp) / str(i), source))
            for i, (name, answers) in enumerate(ANSWER_SETS.items())
        }


def table(counts: dict[str, dict[str, int]]) -> str:
    rows = [
        "| answers | Python outside tests/ | budget | train.py | budget |",
        "|---|---|---|---|---|",
    ]
    for name, lines in counts.items():
        total_budget, train_budget = BUDGETS[name]
        train = f"{lines['train.py']} | {train_budget or ''}"
        rows.append(f"| {name} | {sum(lines.values())} | {total_budget} | {train} |")
    return "\n".join(rows)


def main() -> int:
    # run_all.py passes every benchmark its options (--quick, --device, ...): none matter here.
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_known_args()
    counts = measure()
    print("## Lines of rendered code\n")
    print(__doc__.split("\n\n")[0].replace("\n", " ") + "\n")
    print(table(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
