"""The last migration step of every `copier update` (copier.yml), run in the project.

Copier marks the lines where a user's edit and the template's change collide, and exits 0
all the same. This runs the project's own conflict check (tests/test_no_conflicts.py),
which lists the files left with conflict markers or rejected hunks, and fails the update
when there are any, so that they are not committed by mistake.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = Path("tests/test_no_conflicts.py")


def main() -> int:
    if not CHECK.is_file():
        print(f"check_conflicts: {CHECK} is gone; `git status` shows what did not merge")
        return 0
    if subprocess.run([sys.executable, str(CHECK)]).returncode == 0:
        return 0
    print(
        "copier update left the conflicts listed above: resolve them (and remove the .rej "
        "files), run the tests, then commit",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
