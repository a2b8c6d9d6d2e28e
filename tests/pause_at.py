"""Run a script with its training held at a known step until a stop signal comes, so that a
test can signal or kill a run at a point the run cannot have passed (never on timing luck):

    python tests/pause_at.py STEPS MARKER train.py [flags...]

After STEPS optimizer steps in this process, the next optimizer step waits before it starts:
everything of step STEPS is done (its checkpoint too, with --save-every 1). MARKER is then
written, holding the process id; under torchrun each process writes MARKER.<RANK>, and a
process restarted by torchrun does not wait. The wait ends when SIGTERM, SIGUSR1 or SIGINT
arrives (passed on to the script's own handler, which sees it as it would have anyway);
SIGKILL simply ends the process there. A wait of more than 5 minutes is an error.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_pre_hook

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
LONGEST_WAIT_S = 300


def wait_for_a_stop_signal(marker: Path) -> None:
    arrived = []
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def observe(signum, frame):
        arrived.append(signum)
        handler = handlers[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, observe)
    partial = marker.with_name(marker.name + ".partial")
    partial.write_text(str(os.getpid()))
    os.replace(partial, marker)  # whole when it appears: a test reads the process id in it
    deadline = time.monotonic() + LONGEST_WAIT_S
    try:
        while not arrived:
            if time.monotonic() > deadline:
                raise SystemExit(f"pause_at: no stop signal came within {LONGEST_WAIT_S} s")
            time.sleep(0.01)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def hold_before_step(steps: int, marker: Path) -> None:
    """Hold this process before its optimizer step `steps` + 1 until a stop signal comes
    (see above); under torchrun, not in a process it restarted."""
    if "RANK" in os.environ:
        marker = marker.with_name(f"{marker.name}.{os.environ['RANK']}")
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    taken = 0

    def before_step(optimizer, args, kwargs) -> None:
        nonlocal taken
        taken += 1
        if taken == steps + 1 and not restarted:
            wait_for_a_stop_signal(marker)

    register_optimizer_step_pre_hook(before_step)


def main() -> None:
    steps, marker, script, *args = sys.argv[1:]
    hold_before_step(int(steps), Path(marker))
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
