"""Imported at start-up by every Python of a SLURM test job (the tests put this folder on
PYTHONPATH), so that the job's own scripts/slurm.sbatch runs unchanged while the test holds
or breaks its training processes (those torchrun starts: they have RANK):

  HOLD_AT="STEPS MARKER"  hold before optimizer step STEPS + 1 until a stop signal comes
                          (tests/pause_at.py), in the job's first run only, not once requeued;
  FAIL_AT="STEPS RANK"    the process of that rank fails before optimizer step STEPS + 1, in
                          every run, as a broken rank would.
"""

import os
import sys
from pathlib import Path

if "RANK" in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    if "HOLD_AT" in os.environ and "SLURM_RESTART_COUNT" not in os.environ:
        from pause_at import hold_before_step

        steps, marker = os.environ["HOLD_AT"].split(" ", 1)
        hold_before_step(int(steps), Path(marker))
    if "FAIL_AT" in os.environ:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        steps, rank = map(int, os.environ["FAIL_AT"].split())
        taken = 0

        def fail(optimizer, args, kwargs) -> None:
            global taken
            taken += 1
            if taken > steps and int(os.environ["RANK"]) == rank:
                raise SystemExit(f"rank {rank}: failing on purpose at step {taken}")

        register_optimizer_step_pre_hook(fail)
