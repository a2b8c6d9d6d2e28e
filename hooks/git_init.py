"""Copier task, run in the new project only when `git_init` was answered yes.

Puts the rendered project under git with one commit, so that `copier update` (which needs a
clean git work tree) works from day one. It changes nothing when the project is already
inside a git work tree, and leaves the commit to the user when git cannot commit (no
identity set, say).
"""

from __future__ import annotations

import shutil
import subprocess
import sys


def git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=check)


def main() -> int:
    if shutil.which("git") is None:
        print("git_init: git is not installed; skipped", file=sys.stderr)
        return 0
    if git("rev-parse", "--is-inside-work-tree", check=False).returncode == 0:
        print("git_init: already inside a git work tree; nothing done", file=sys.stderr)
        return 0
    git("init", "--quiet")
    git("add", "--all")
    message = "Project rendered from copier-torch-train"
    if git("commit", "--quiet", "--no-verify", "-m", message, check=False).returncode != 0:
        print(
            "git_init: created the repository and staged the files, but git could not commit "
            "(is user.name and user.email set?); commit them yourself",
            file=sys.stderr,
        )
        return 0
    print("git_init: created the repository with a first commit", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
