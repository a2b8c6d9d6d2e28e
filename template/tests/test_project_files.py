"""No leftovers of a `copier update` that did not merge cleanly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Built here so that this file does not contain the markers it looks for.
MARKERS = ("<" * 7 + " ", ">" * 7 + " ")
SEPARATOR = "=" * 7


def is_skipped(folder: Path) -> bool:
    """Outputs, downloads, caches, virtual environments and hidden folders (.git, .venv)."""
    return (
        folder.name in {"runs", "data", "build", "dist", "__pycache__"}
        or folder.name.startswith(".")
        or folder.name.endswith(".egg-info")
        or (folder / "pyvenv.cfg").exists()
    )


def project_files() -> Iterator[Path]:
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not is_skipped(Path(folder, d))]
        for name in files:
            yield Path(folder, name)


def test_no_conflict_markers():
    conflicted = []
    for path in project_files():
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue  # not text
        if any(line.startswith(MARKERS) or line == SEPARATOR for line in lines):
            conflicted.append(str(path.relative_to(ROOT)))
    assert not conflicted, f"unresolved merge conflicts in: {', '.join(conflicted)}"


def test_no_rejected_hunks():
    rejected = [str(p.relative_to(ROOT)) for p in project_files() if p.suffix == ".rej"]
    assert not rejected, f"copier update left rejected changes in: {', '.join(rejected)}"
