"""Rendering the template and running what it renders, for the tests."""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import os
import runpy
import shutil
import subprocess
import sys
import weakref
from pathlib import Path
from types import CodeType

import copier
import jinja2
from jinja2.utils import internalcode

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


# Copier builds a new Jinja environment for every render and compiles every template again:
# most of a render's time. What compiling gives depends only on the source, the template's
# name and the environment's configuration (the file's path only names it in tracebacks), so
# the tests keep the code in memory for the whole process, as a Jinja bytecode cache would,
# and renders stay byte for byte the same (tests/test_render_cache.py compares them).
COMPILE_CACHE: dict[tuple, object] = {}
COMPILE_STATS = {"hits": 0, "misses": 0}
_compile = jinja2.Environment.compile


def _named(value) -> tuple | str:
    """A filter or test by what it is, not where it lies in memory."""
    if isinstance(value, functools.partial):  # Copier's to_json, made for each environment
        keywords = tuple(sorted((k, _named(v)) for k, v in value.keywords.items()))
        return _named(value.func), tuple(map(_named, value.args)), keywords
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__module__, value.__qualname__
    return repr(value)


def _environment_key(env: jinja2.Environment, name: str | None) -> tuple:
    """What of an environment the compiled code depends on."""
    autoescape = env.autoescape(name) if callable(env.autoescape) else env.autoescape
    return (
        type(env),
        tuple(type(extension) for extension in env.iter_extensions()),
        env.code_generator_class,
        env.block_start_string,
        env.block_end_string,
        env.variable_start_string,
        env.variable_end_string,
        env.comment_start_string,
        env.comment_end_string,
        env.line_statement_prefix,
        env.line_comment_prefix,
        env.trim_blocks,
        env.lstrip_blocks,
        env.newline_sequence,
        env.keep_trailing_newline,
        env.optimized,
        env.is_async,
        autoescape,
        env.finalize and _named(env.finalize),
        frozenset(getattr(env, "intercepted_binops", ())),
        frozenset(getattr(env, "intercepted_unops", ())),
        _functions(env),
    )


_FUNCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _functions(env: jinja2.Environment) -> tuple:
    """The environment's filters and tests by what they are (named once per environment,
    and again if they change)."""
    tables = (env.filters, env.tests)
    ids = tuple(tuple((key, id(f)) for key, f in table.items()) for table in tables)
    known = _FUNCTIONS.get(env)
    if known is None or known[0] != ids:
        named = tuple(tuple(sorted((key, _named(f)) for key, f in t.items())) for t in tables)
        known = _FUNCTIONS[env] = (ids, named)
    return known[1]


def _in_file(code: CodeType, filename: str) -> CodeType:
    """`code` as compile() gives it for `filename`."""
    if code.co_filename == filename:
        return code
    consts = tuple(_in_file(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


@internalcode
def _cached_compile(self, source, name=None, filename=None, raw=False, defer_init=False):
    if not isinstance(source, str):
        return _compile(self, source, name, filename, raw, defer_init)
    # Extensions see each source before it is parsed (Copier's yield tag resets its state
    # there): that still happens for every template, cached or not.
    self.preprocess(source, name, filename)
    key = (_environment_key(self, name), source, name, raw, defer_init)
    code = COMPILE_CACHE.get(key)
    if code is None:
        COMPILE_STATS["misses"] += 1
        code = COMPILE_CACHE[key] = _compile(self, source, name, filename, raw, defer_init)
        return code
    COMPILE_STATS["hits"] += 1
    return code if raw else _in_file(code, filename or "<template>")


def cache_compiled_templates(on: bool = True) -> None:
    """Keep (or stop keeping) compiled Jinja templates for every render of this process."""
    jinja2.Environment.compile = _cached_compile if on else _compile


# Every optional part, in the order of the extras question.
EXTRAS = ("preemption", "device_data", "guard", "finders", "ema", "tensorboard", "speed_report")
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


def script_exit(project: Path, *flags) -> tuple[int | str | None, str]:
    """Run the project's train.py as a script in this process until it ends, as `python
    train.py FLAGS` would (its `__main__` block included, without a new interpreter): return
    what it exits with (sys.exit's argument: a message exits with status 1) and what it wrote
    to stderr meanwhile."""
    stderr = io.StringIO()
    with inside(project), contextlib.redirect_stderr(stderr):
        sys.argv = ["train.py", *map(str, flags)]
        try:
            runpy.run_path("train.py", run_name="__main__")
        except SystemExit as exit:
            return exit.code, stderr.getvalue()
    return 0, stderr.getvalue()


def read_metrics(out_dir: Path, name: str = "metrics.csv") -> list[dict]:
    with (out_dir / name).open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def run(*cmd, cwd=None, check=True, **kwargs) -> subprocess.CompletedProcess:
    """Run a command; on failure show its output in the test report. A command that hangs
    fails its test after 10 minutes (the longest takes about 1) instead of stalling the suite."""
    kwargs.setdefault("timeout", 600)
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
