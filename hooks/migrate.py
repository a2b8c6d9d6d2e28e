"""Copier migrations, run by `copier update` in the project being updated (see copier.yml).

    migrate.py rename-answer OLD NEW   before the update: the answer recorded as OLD in
                                       .copier-answers.yml is kept under the name NEW
    migrate.py move-file OLD NEW       after the update: the template moved the file OLD to
                                       NEW; edits the user made to OLD are merged into NEW
    migrate.py gather-extras           before the update to v0.7.0: the answers ema and
                                       logger become entries of the question extras
    migrate.py keep-edits              after every update: a file that held your edits and
                                       that the update removed is kept, and a renamed
                                       package (package_name) takes your files with it

Copier sets VERSION_FROM (the template's commit the project was last rendered from) in the
environment; the template's repository is the folder above this script. Each step changes
nothing in a project that does not need it, so running it twice is harmless.
"""

from __future__ import annotations

import os
import re
import shutil
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


def keep_edits() -> None:
    """Called after every update, once Copier has merged. Copier deletes the files that the
    template no longer renders, edited or not: the template dropped them, or an answer
    changed (a renamed package, an extra turned off). Every such file that holds edits of
    the user (it differs from the release the project was at, rendered with the answers it
    had) is kept: merged into the file that replaces it when the package was renamed, put
    back where it was otherwise. Files of the user's own in the old package folder move to
    the new one, and imports of the old package are rewritten."""
    import yaml

    old_answers = yaml.safe_load(git("show", f"HEAD:./{ANSWERS}").stdout or "{}") or {}
    new_answers = yaml.safe_load(ANSWERS.read_text()) or {}
    old_package, new_package = old_answers.get("package_name"), new_answers.get("package_name")
    renamed = bool(old_package and new_package and old_package != new_package)
    listed = git("ls-tree", "-r", "-z", "--name-only", "HEAD", "--", ".").stdout
    moved = set(moved_by_migrations())
    removed = [p for p in listed.split("\0") if p and p not in moved and not os.path.lexists(p)]
    left = [p for p in listed.split("\0") if renamed and p.startswith(f"{old_package}/")]
    left = [p for p in left if os.path.lexists(p)]
    if not removed and not left:
        return
    rename = (old_package, new_package) if renamed else None
    tree = git("ls-tree", "-r", "-z", "HEAD", "--", ".").stdout.split("\0")
    executable = {entry.split("\t", 1)[1] for entry in tree if entry.startswith("100755 ")}
    with tempfile.TemporaryDirectory() as folder:
        before = render_old_release(Path(folder, "before"), old_answers)
        base = before
        if renamed:  # the old release as it would have been with the new package name
            base = render_old_release(
                Path(folder, "base"), {**old_answers, "package_name": new_package}
            )
        for path in removed + left:
            target = path
            if renamed and path.startswith(f"{old_package}/"):
                target = new_package + path[len(old_package) :]
            if path in removed:
                yours = subprocess.run(
                    ["git", "show", f"HEAD:./{path}"], capture_output=True
                ).stdout
            else:
                yours = Path(path).read_bytes()
            carry(path, target, yours, before, base, rename)
            if path in executable and os.path.isfile(target):  # as the user's file was
                Path(target).chmod(Path(target).stat().st_mode | 0o111)
        if renamed:  # what the user deleted from the old package stays deleted in the new
            kept = set(listed.split("\0"))
            for file in sorted((before / old_package).rglob("*")):
                path = file.relative_to(before).as_posix()
                target = new_package + path[len(old_package) :]
                if file.is_file() and path not in kept and os.path.lexists(target):
                    Path(target).unlink()
                    print(
                        f"migrate: {path} had been deleted, so {target} is not added",
                        file=sys.stderr,
                    )
    if renamed:
        follow_the_rename(old_package, new_package)


def moved_by_migrations() -> list[str]:
    """The files that a move-file step of copier.yml moves: that step carries their edits."""
    import yaml

    config = yaml.safe_load((TEMPLATE_REPO / "copier.yml").read_text())
    moved = []
    for migration in config.get("_migrations", []):
        command = migration.get("command", []) if isinstance(migration, dict) else migration
        if isinstance(command, list) and "move-file" in command:
            moved.append(command[command.index("move-file") + 1])
    return moved


def render_old_release(dest: Path, answers: dict) -> Path:
    """The files of the release the project was at (VERSION_FROM), rendered with `answers`."""
    import warnings

    import copier

    data = {key: value for key, value in answers.items() if not key.startswith("_")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copier.run_copy(
            str(TEMPLATE_REPO),
            dest,
            data=data,
            vcs_ref=os.environ["VERSION_FROM"],
            defaults=True,
            quiet=True,
            unsafe=True,
            skip_tasks=True,
        )
    return dest


def carry(
    path: str, target: str, yours: bytes, before: Path, base: Path, rename: tuple[str, str] | None
) -> None:
    """Keep the user's `yours` of `path` (removed by the update, or left in the old package
    folder) at `target`: nothing to keep if it is the release's own file, unedited."""
    release = before / path
    if release.is_file() and release.read_bytes() == yours:
        if os.path.lexists(path):
            Path(path).unlink()  # the release's file under the package's old name
        return
    if rename and path.endswith(".py"):
        try:
            yours = rewrite_imports(yours.decode(), *rename).encode()
        except UnicodeDecodeError:
            pass  # not text: moved as it is
    if not os.path.lexists(target):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_bytes(yours)
        if target != path:
            Path(path).unlink(missing_ok=True)
            print(f"migrate: moved your {path} to {target}", file=sys.stderr)
        else:
            print(
                f"migrate: kept {path}, which holds your edits, though the template no longer "
                "renders it: delete it if you do not need it",
                file=sys.stderr,
            )
        return
    ancestor = base / target
    if not ancestor.is_file():  # a new file of the template took the name of yours
        print(
            f"migrate: the template now renders {target}, so your {path} stays where it was: "
            "move or merge it yourself",
            file=sys.stderr,
        )
        return
    merged = merge_into(target, ancestor.read_bytes(), yours, f"your edits of {path}")
    if os.path.lexists(path):
        Path(path).unlink()
    if merged == 0:
        print(f"migrate: moved your edits of {path} into {target}", file=sys.stderr)
    elif merged < 128:
        print(
            f"migrate: your edits of {path} conflict with the template's {target} and are "
            f"marked there: resolve them before committing",
            file=sys.stderr,
        )
    else:
        print(
            f"migrate: your edits of {path} could not be merged into {target} (git "
            f"merge-file failed); they are still in git: git show HEAD:./{path}",
            file=sys.stderr,
        )


def merge_into(target: str, base: bytes, yours: bytes, label: str) -> int:
    """git merge-file of the user's edits (`base` to `yours`) into `target`: the number of
    conflicts, marked in `target` (at most 127), or 255 on an error."""
    with tempfile.TemporaryDirectory() as folder:
        mine, ancestor = Path(folder, "yours"), Path(folder, "base")
        mine.write_bytes(yours)
        ancestor.write_bytes(base)
        labels = ["-L", "after updating", "-L", "before updating", "-L", label]
        return git("merge-file", *labels, target, str(ancestor), str(mine)).returncode


def rewrite_imports(text: str, old: str, new: str) -> str:
    """Imports of the package `old` made imports of `new`, and the uses of its name where
    `import old` bound it."""
    name = re.escape(old)
    text = re.sub(rf"^(\s*from\s+){name}(?=[\s.])", rf"\g<1>{new}", text, flags=re.MULTILINE)
    bound = rf"^(\s*import\s+){name}(?=[\s.,]|$)"
    if re.search(bound, text, flags=re.MULTILINE):
        text = re.sub(bound, rf"\g<1>{new}", text, flags=re.MULTILINE)
        text = re.sub(rf"(?<![\w.]){name}(?=\.\w)", new, text)
    return text


def follow_the_rename(old: str, new: str) -> None:
    """After the package's files moved: imports of the old package in the project's other
    Python files, the old folder's caches, and a word on what still names it."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout
    files = [Path(p) for p in dict.fromkeys(listed.split("\0")) if p and Path(p).is_file()]
    rewritten, naming = [], []
    for path in files:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if path.suffix == ".py" and rewrite_imports(text, old, new) != text:
            path.write_text(rewrite_imports(text, old, new))
            rewritten.append(str(path))
        elif path != ANSWERS and re.search(rf"(?<![\w./-]){re.escape(old)}[/.]\w", text):
            naming.append(str(path))
    if rewritten:
        print(
            f"migrate: imports of {old} now import {new} in {', '.join(rewritten)}", file=sys.stderr
        )
    if naming:
        print(
            f"migrate: still naming the old package ({old}/ or {old}.): {', '.join(naming)}",
            file=sys.stderr,
        )
    folder = Path(old)
    if folder.is_dir():
        for cache in sorted(folder.rglob("__pycache__")):
            shutil.rmtree(cache)
        for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
            if not any(sub.iterdir()):
                sub.rmdir()
        if not any(folder.iterdir()):
            folder.rmdir()
        else:
            print(
                f"migrate: {old}/ still holds files that git does not track; move them to "
                f"{new}/ if they belong to the package",
                file=sys.stderr,
            )


def main(argv: list[str]) -> None:
    commands = {"rename-answer": (rename_answer, 2), "move-file": (move_file, 2)}
    commands["gather-extras"] = (gather_extras, 0)
    commands["keep-edits"] = (keep_edits, 0)
    if not argv or argv[0] not in commands or len(argv) != 1 + commands[argv[0]][1]:
        sys.exit(f"usage: see {__file__} (got {' '.join(argv)})")
    step, _ = commands[argv[0]]
    step(*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
