"""Rendering the template and running what it renders, for the tests."""

from __future__ import annotations

import contextlib
import csv
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import copier

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "proj"  # the package name every test project gets, unless a test says otherwise

AMPS = ("off", "bf16", "fp16")
OPTIMIZERS = ("sgd", "adam", "adamw", "nadam", "rmsprop", "adagrad", "adadelta", "lamb", "lars")
SCHEDULERS = ("warmup_cosine", "onecycle", "cyclic", "cosine_restarts", "step", "constant")

# Flags that make a run of the rendered train.py take a second or so on a CPU.
TINY_RUN = ["--synthetic-size", "96", "--batch-size", "16", "--epochs", "2", "--workers", "0"]


def snapshot_template(dest: Path) -> Path:
    """Copy what Copier reads (not .venv, caches or git) into `dest`: rendering from the
    working tree itself would make Copier copy all of it first."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "copier.yml", dest / "copier.yml")
    for folder in ("template", "hooks"):
        if (ROOT / folder).is_dir():
            shutil.copytree(
                ROOT / folder,
                dest / folder,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
    return dest


# Every optional part, in the order of the extras question.
EXTRAS = ("preemption", "device_data", "guard", "finders", "ema", "tensorboard")
# The extras that test projects get unless a test names its own: those that add run-time
# behaviour (flags, signals, checks) which most tests exercise. EMA and TensorBoard change
# the outputs, so the tests that want them ask.
RUNTIME_EXTRAS = ["preemption", "device_data", "guard", "finders"]
WITH_EMA = [*RUNTIME_EXTRAS, "ema"]


def render(template: Path, dest: Path, **answers) -> Path:
    answers.setdefault("package_name", PACKAGE)
    answers.setdefault("extras", RUNTIME_EXTRAS)
    copier.run_copy(str(template), dest, data=answers, defaults=True, unsafe=True, quiet=True)
    return dest


@contextlib.contextmanager
def inside(project: Path):
    """Run code as if `python train.py` was started in `project`: its folder first on
    sys.path, as the working directory, and its modules forgotten afterwards."""
    old_cwd, old_path, old_argv = os.getcwd(), list(sys.path), list(sys.argv)
    os.chdir(project)
    sys.path.insert(0, str(project))
    folder = os.path.join(os.path.realpath(project), "")
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:], sys.argv[:] = old_path, old_argv
        for name, module in list(sys.modules.items()):
            file = os.path.realpath(getattr(module, "__file__", None) or os.devnull)
            if name == "train" or name.split(".")[0] == PACKAGE or file.startswith(folder):
                del sys.modules[name]


def train(project: Path, *flags: str) -> list[dict]:
    """Run the project's train.py as a script in this process; return metrics.csv's rows
    (of --out-dir, runs/test unless the flags name another)."""
    out_dir = project / "runs" / "test"
    if "--out-dir" in flags:
        out_dir = Path(flags[flags.index("--out-dir") + 1])
    with inside(project):
        sys.argv = ["train.py", "--out-dir", str(out_dir), *flags]
        runpy.run_path("train.py", run_name="__main__")
    return read_metrics(out_dir)


def read_metrics(out_dir: Path) -> list[dict]:
    with (out_dir / "metrics.csv").open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def run(*cmd, cwd=None, check=True, **kwargs) -> subprocess.CompletedProcess:
    """Run a command; on failure show its output in the test report."""
    result = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, **kwargs
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
        )
    return result


def ruff(*args) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "ruff", *args, check=False)


# git with a fixed identity and no user or system configuration, for update tests.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": os.environ["PATH"],
}


def git(cwd: Path, *args: str) -> str:
    return run("git", *args, cwd=cwd, env=GIT_ENV).stdout


def commit_all(cwd: Path, message: str) -> None:
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "-m", message)


def tag_release(repo: Path, version: str) -> None:
    """Commit the template repository's working tree as release `version`."""
    if not (repo / ".git").exists():
        git(repo, "init", "-q", "-b", "main")
    commit_all(repo, version)
    git(repo, "tag", version)


def render_release(template_repo: Path, dest: Path, version: str, **answers) -> Path:
    """Render `version` of the template into `dest` and commit it, as a user would."""
    copier.run_copy(
        str(template_repo),
        dest,
        data={"package_name": PACKAGE, **answers},
        defaults=True,
        unsafe=True,
        quiet=True,
        vcs_ref=version,
    )
    git(dest, "init", "-q", "-b", "main")
    commit_all(dest, "rendered")
    return dest


def update(project: Path, **answers) -> None:
    copier.run_update(
        project,
        data=answers,
        defaults=True,
        overwrite=True,
        unsafe=True,
        quiet=True,
        conflict="inline",
    )


def assert_no_conflicts(project: Path) -> None:
    for path in project.rglob("*"):
        if ".git" in path.parts or not path.is_file():
            continue
        assert path.suffix != ".rej", path
        text = path.read_text(errors="replace")
        for marker in ("<" * 7 + " ", "\n" + "=" * 7 + "\n", ">" * 7 + " "):
            assert marker not in text, f"conflict marker in {path}"
