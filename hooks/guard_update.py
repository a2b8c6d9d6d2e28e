"""An interrupted `copier update` puts the project back as it was (copier.yml's _migrations).

    guard_update.py start   the first step of every update, before Copier writes anything in
                            the project: note the project's last commit and, when a copier
                            command runs the update, start a watcher of that command
    guard_update.py done    after the update's last change to the project's files: the
                            update is done, and the watcher stands down

Copier refuses to update a project with uncommitted changes, so the project's last commit
is exactly the project as it was. Copier then writes the new release over the files and
merges the user's edits back in afterwards: a Ctrl-C, a closed terminal or a failed step in
between left files half-updated (a committed edit reverted, no conflict markers) with only
"Execution stopped by user". The watcher runs apart from the copier command (its own
session, so Ctrl-C does not reach it); when that command ends before `done`, the watcher
restores the project's files from the commit, removes the files the update added (git
ignores what .gitignore lists, so outputs and data stay), and says so. By hand, in the
project: git restore --source=HEAD --staged --worktree . && git clean -fd .

Only a copier command is watched: a program that calls Copier's Python API goes on after a
failed update, and is left to decide what to do with the project.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

RESTORE = "git restore --source=HEAD --staged --worktree . && git clean -fd ."


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def marker() -> Path:
    """Where the update in progress is noted: inside .git, not among the project's files."""
    return Path(git("rev-parse", "--git-path", "copier-update-in-progress").stdout.strip())


def command_line(pid: int) -> list[str]:
    proc = Path(f"/proc/{pid}/cmdline")
    if proc.exists():
        return proc.read_bytes().decode(errors="replace").split("\0")
    shown = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True)
    return shown.stdout.split()


def is_copier_command(pid: int) -> bool:
    """`copier update ...`, `python -m copier update ...`, pipx's and uv's copier alike."""
    return any(Path(arg).name in ("copier", "copier.exe") for arg in command_line(pid))


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A process that has ended but that its parent has not waited for yet is a zombie.
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        return stat.read_text().rpartition(")")[2].split()[0] != "Z"
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return not state.stdout.strip().startswith("Z")


def start() -> None:
    head = git("rev-parse", "--verify", "HEAD").stdout.strip()
    copier = os.getppid()
    note = {"commit": head, "copier": copier, "project": os.getcwd()}
    path = marker()
    path.write_text(json.dumps(note))
    if head and is_copier_command(copier):
        subprocess.Popen(
            [sys.executable, __file__, "watch", str(path.resolve()), path.read_text()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def done() -> None:
    marker().unlink(missing_ok=True)


def watch(path: Path, note_text: str) -> int:
    """Wait for the update to be done (the note gone or replaced) or for the copier command
    to end without it; in the second case put the project back at its last commit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    note = json.loads(note_text)
    while True:
        try:
            if path.read_text() != note_text:
                return 0
        except FileNotFoundError:
            return 0
        if not is_running(note["copier"]):
            break
        time.sleep(0.05)
    os.chdir(note["project"])
    commit = note["commit"]
    steps = (
        ["restore", f"--source={commit}", "--staged", "--worktree", "--", "."],
        ["clean", "-f", "-d", "-q", "--", "."],
    )
    for step in steps:
        result = git(*step)
        if result.returncode != 0:
            error = (result.stderr.strip().splitlines() or ["no message"])[-1]
            print(
                f"copier update stopped before it was done, and putting the project back "
                f"failed (git {step[0]}: {error}); to do it by hand, in {note['project']}: "
                f"{RESTORE}",
                file=sys.stderr,
            )
            return 1
    path.unlink(missing_ok=True)
    print(
        f"copier update stopped before it was done: the project is back as it was at its "
        f"last commit, {commit[:12]}; run the update again",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str]) -> int:
    if argv == ["start"]:
        start()
    elif argv == ["done"]:
        done()
    elif len(argv) == 3 and argv[0] == "watch":
        return watch(Path(argv[1]), argv[2])
    else:
        sys.exit(f"usage: see {__file__} (got {' '.join(argv)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
