"""Copier migrations, run by `copier update` in the project being updated (see copier.yml).

    migrate.py rename-answer OLD NEW   before the update: the answer recorded as OLD in
                                       .copier-answers.yml is kept under the name NEW
    migrate.py move-file OLD NEW       after the update: the template moved the file OLD to
                                       NEW; edits the user made to OLD are merged into NEW
    migrate.py gather-extras           before the update to v0.7.0: the answers ema and
                                       logger become entries of the question extras

Copier sets VERSION_FROM (the template's commit the project was last rendered from) in the
environment; the template's repository is the folder above this script. Each step changes
nothing in a project that does not need it, so running it twice is harmless.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ANSWERS = Path(".copier-answers.yml")
TEMPLATE_REPO = Path(__file__).resolve().parents[1]
SUBDIRECTORY = "template"  # copier.yml's _subdirectory


def git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def rename_answer(old: str, new: str) -> None:
    text = ANSWERS.read_text()
    if not re.search(rf"^{re.escape(old)}:", text, flags=re.MULTILINE):
        return  # answered under the new name already, or never
    if re.search(rf"^{re.escape(new)}:", text, flags=re.MULTILINE):
        sys.exit(f"migrate: {ANSWERS} has both {old} and {new}; remove {old} and run again")
    ANSWERS.write_text(re.sub(rf"^{re.escape(old)}:", f"{new}:", text, flags=re.MULTILINE))
    print(f"migrate: the answer {old} is now called {new}", file=sys.stderr)


def gather_extras() -> None:
    """v0.7.0 asks for the optional parts in one multi-select question, extras. `ema: true`
    becomes the extra ema and `logger: tensorboard` the extra tensorboard; the project keeps
    what every project had before: preemption, the on-device data path, the guard against
    non-finite losses and the finders."""
    text = ANSWERS.read_text()
    if re.search(r"^extras:", text, flags=re.MULTILINE):
        return  # answered already
    ema = re.search(r"^ema:\s*(\S+)", text, flags=re.MULTILINE)
    logger = re.search(r"^logger:\s*(\S+)", text, flags=re.MULTILINE)
    extras = ["preemption", "device_data", "guard", "finders"]
    if ema and ema.group(1).lower() == "true":
        extras.append("ema")
    if logger and logger.group(1).strip("'\"") == "tensorboard":
        extras.append("tensorboard")
    text = re.sub(r"^(ema|logger):.*\n", "", text, flags=re.MULTILINE)
    text += "extras:\n" + "".join(f"- {extra}\n" for extra in extras)
    ANSWERS.write_text(text)
    print(f"migrate: the optional parts are now the answer extras: {extras}", file=sys.stderr)


def move_file(old: str, new: str) -> None:
    """Called after the update: OLD is gone (Copier removes what the template dropped) and NEW
    holds the template's new version. The user's OLD is still in git (HEAD), because Copier
    refuses to update a project with uncommitted changes."""
    user = git("show", f"HEAD:{old}")
    version_from = os.environ.get("VERSION_FROM", "")
    base = git("show", f"{version_from}:{SUBDIRECTORY}/{old}", cwd=TEMPLATE_REPO)
    if base.returncode != 0:
        return  # the project's old release did not have OLD: nothing moved
    if user.returncode != 0:  # the user had deleted OLD: keep it deleted under its new name
        Path(new).unlink(missing_ok=True)
        print(f"migrate: {old} had been deleted, so {new} is not added", file=sys.stderr)
        return
    Path(old).unlink(missing_ok=True)
    Path(f"{old}.rej").unlink(missing_ok=True)  # the hunks Copier could not place: merged below
    if user.stdout == base.stdout or not Path(new).exists():
        return  # not edited, so the template's new file is all there is to keep
    with tempfile.TemporaryDirectory() as folder:
        mine, ancestor = Path(folder, "yours"), Path(folder, "base")
        mine.write_text(user.stdout)
        ancestor.write_text(base.stdout)
        merge = git(
            "merge-file",
            "-L",
            "after updating",
            "-L",
            "before updating",
            "-L",
            f"your edits of {old}",
            new,
            str(ancestor),
            str(mine),
        )
    # git merge-file exits with the number of conflicts (at most 127), or 255 on an error.
    if merge.returncode == 0:
        print(f"migrate: moved your edits of {old} into {new}", file=sys.stderr)
    elif merge.returncode < 128:
        print(
            f"migrate: {old} moved to {new}; your edits conflict with the template's and are "
            f"marked in {new}: resolve them before committing",
            file=sys.stderr,
        )
    else:
        error = merge.stderr.strip().splitlines()[-1:] or ["no message"]
        print(
            f"migrate: {old} moved to {new}, but your edits could not be merged into it "
            f"(git merge-file: {error[0]}); {new} is the template's, and your {old} is still "
            f"in git: git show HEAD:{old}",
            file=sys.stderr,
        )


def main(argv: list[str]) -> None:
    commands = {"rename-answer": (rename_answer, 2), "move-file": (move_file, 2)}
    commands["gather-extras"] = (gather_extras, 0)
    if not argv or argv[0] not in commands or len(argv) != 1 + commands[argv[0]][1]:
        sys.exit(f"usage: see {__file__} (got {' '.join(argv)})")
    step, _ = commands[argv[0]]
    step(*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
