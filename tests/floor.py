"""What a rendered project declares, it is tested with: the lowest torch, torchvision and
numpy that its pyproject.toml allows are installed, exactly, into a virtual environment of
its own, where the project's own tests and a short training run, then its resume, must pass.
Run by `make test-floor`, which CI runs after `make test`: a few minutes, mostly pip's.

    .venv/bin/python tests/floor.py [--venvs .venv-floor]

One environment per set of lowest versions, kept under --venvs for the next run. Where the
environment running this script has exactly those versions (the image projects' lowest are
what requirements-dev.txt resolves to here), it is used as it is.
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import copier
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
FLOORED = ("torch", "torchvision", "numpy")  # held to their lowest version where declared
ANSWER_SETS = {"defaults": {}, "data: tensors": {"data": "tensors"}}
RUN = ["--synthetic-size", "64", "--batch-size", "16", "--workers", "0", "--out-dir", "runs/floor"]


def requirements(project: Path) -> tuple[dict[str, str], list[str]]:
    """({distribution: lowest version} of FLOORED, the other requirements as declared) of
    the project's dependencies and of its dev extra's pytest."""
    text = (project / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.MULTILINE | re.DOTALL).group(1)
    declared = re.findall(r'"([^"]+)"', block)
    declared += [r for r in re.findall(r'"(pytest[^"]*)"', text) if r.startswith("pytest>")]
    lowest, others = {}, []
    for requirement in declared:
        name, operator, version = re.fullmatch(r"([\w.-]+)\s*(>=)?\s*(\S*)", requirement).groups()
        if name not in FLOORED:
            others.append(requirement)
        elif operator != ">=" or "," in version:
            sys.exit(f"{project}: {requirement!r} gives no lowest version to test")
        else:
            lowest[name] = version
    return lowest, others


def versions(python: Path) -> dict[str, str]:
    """{distribution: installed version} of FLOORED in the environment of `python`."""
    code = (
        "from importlib import metadata\n"
        f"for name in {FLOORED!r}:\n"
        "    try:\n"
        "        print(name, metadata.version(name))\n"
        "    except metadata.PackageNotFoundError:\n"
        "        pass\n"
    )
    result = run(python, "-c", code)
    return dict(line.split() for line in result.stdout.splitlines())


def exactly(installed: dict[str, str], lowest: dict[str, str]) -> bool:
    """Whether the installed versions are the lowest ones (2.13.0+cpu is 2.13)."""
    return set(installed) >= set(lowest) and all(
        Version(Version(installed[name]).base_version) == Version(version)
        for name, version in lowest.items()
    )


def environment(lowest: dict[str, str], others: list[str], venvs: Path) -> Path:
    """The python of an environment with exactly the `lowest` versions and the others."""
    if exactly(versions(Path(sys.executable)), lowest):
        return Path(sys.executable)
    venv = venvs / "-".join(f"{name}-{version}" for name, version in sorted(lowest.items()))
    python = venv / "bin" / "python"
    if not (python.exists() and exactly(versions(python), lowest)):
        run(sys.executable, "-m", "venv", "--clear", venv)
        pins = [f"{name}=={version}" for name, version in lowest.items()]
        run(python, "-m", "pip", "install", "--quiet", *pins, *others)
    installed = versions(python)
    if not exactly(installed, lowest):
        sys.exit(f"pip installed {installed} in {venv}, not the lowest versions {lowest}")
    return python


def run(*command, cwd=None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(
            f"{' '.join(map(str, command))} exited {result.returncode}\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def check(project: Path, python: Path) -> str:
    """The project's tests, a 2-epoch run and its resume to 3 epochs, under `python`."""
    tests = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project)
    run(python, "train.py", *RUN, "--epochs", "2", cwd=project)
    resumed = run(python, "train.py", *RUN, "--epochs", "3", cwd=project)
    if "resumed from" not in resumed.stdout:
        sys.exit(f"{project}: the run did not resume:\n{resumed.stdout}")
    with (project / "runs/floor/metrics.csv").open(newline="") as f:
        epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
    if epochs != [1, 2, 3]:
        sys.exit(f"{project}: metrics.csv has epochs {epochs}, not 1, 2, 3")
    return tests.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venvs", type=Path, default=ROOT / ".venv-floor")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="floor-") as folder:
        for name, answers in ANSWER_SETS.items():
            project = Path(folder) / re.sub(r"\W+", "-", name)
            ref = {"vcs_ref": "HEAD"} if (ROOT / ".git").exists() else {}
            copier.run_copy(
                str(ROOT), project, data=answers, defaults=True, unsafe=True, quiet=True, **ref
            )
            lowest, others = requirements(project)
            python = environment(lowest, others, args.venvs.resolve())
            shown = ", ".join(f"{n} {v}" for n, v in versions(python).items())
            where = "this environment" if python == Path(sys.executable) else python.parents[1]
            print(f"{name}: {shown} ({where}): {check(project, python)}; trained, resumed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
