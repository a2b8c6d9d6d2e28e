"""No leftovers of a `copier update` that did not merge cleanly.

Run by pytest with the other tests, and as a pre-commit hook (.pre-commit-config.yaml):
`python tests/test_no_conflicts.py` lists the files with conflict markers or rejected
hunks and exits with status 1, so that they cannot be committed by mistake."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Built here so that this file does not contain the markers it looks for.
MARKERS = ("<" * 7 + " ", ">" * 7 + " ")
SEPARATOR = "=" * 7


def is_skipped(folder: Path) -> bool:
    """Outputs and downloads at the top of the project, caches, virtual environments and
    hidden folders (.git, .venv). A folder deeper down is checked whatever its name."""
    top_level = folder.parent == ROOT
    return (
        (top_level and folder.name in {"runs", "data", "build", "dist"})
        or folder.name == "__pycache__"
        or folder.name.startswith(".")
        or folder.name.endswith(".egg-info")
        or (folder / "pyvenv.cfg").exists()
    )


def project_files() -> Iterator[Path]:
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not is_skipped(Path(folder, d))]
        for name in files:
            yield Path(folder, name)


def conflicted_files() -> list[str]:
    conflicted = []
    for path in project_files():
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue  # not text
        if any(line.startswith(MARKERS) or line == SEPARATOR for line in lines):
            conflicted.append(str(path.relative_to(ROOT)))
    return conflicted


def rejected_files() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in project_files() if p.suffix == ".rej"]


def test_no_conflict_markers():
    conflicted = conflicted_files()
    assert not conflicted, f"unresolved merge conflicts in: {', '.join(conflicted)}"


def test_no_rejected_hunks():
    rejected = rejected_files()
    assert not rejected, f"copier update left rejected changes in: {', '.join(rejected)}"


if __name__ == "__main__":
    problems = [f"{name}: unresolved merge conflict" for name in conflicted_files()]
    problems += [f"{name}: rejected changes of copier update" for name in rejected_files()]
    for problem in problems:
        print(problem, file=sys.stderr)
    sys.exit(1 if problems else 0)
