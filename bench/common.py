"""What the benchmarks share: rendering the template, running a rendered project in this
process, interleaved A/B measurement and markdown tables.

Every benchmark renders the working tree with the real Copier into a temporary folder and
imports the rendered package from there, so that it measures the code a user would get.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "proj"  # the package name of every rendered benchmark project


def log(message: str) -> None:
    """Progress goes to stderr; stdout carries only the markdown result."""
    print(message, file=sys.stderr, flush=True)


def parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes and 1-2 repeats: a smoke check only"
    )
    parser.add_argument("--repeats", type=int, default=None, help="measured pairs per row")
    parser.add_argument("--keep", type=Path, default=None, help="render into this folder")
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda: where both sides of every pair train"
    )
    parser.add_argument(
        "--project",
        type=Path,
        default=None,
        help="a project already rendered from this tree with the default answers and "
        f"package_name {PACKAGE} (bench/render_gpu_projects.sh makes one): used instead of "
        "rendering, for machines without Copier",
    )
    return parser


def default_project(options: argparse.Namespace, work: Path) -> Project:
    """The project rendered with the default answers, or the one --project names."""
    if options.project is not None:
        if not (options.project / "train.py").is_file():
            raise SystemExit(f"--project {options.project}: no train.py there")
        return Project(options.project)
    return Project(render(work / "default"))


@contextlib.contextmanager
def workdir(keep: Path | None = None) -> Iterator[Path]:
    """A scratch folder, removed afterwards unless the caller named one to keep."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="bench-") as folder:
        yield Path(folder)


def render(dest: Path, **answers) -> Path:
    """Render the working tree's template into `dest` with the real Copier: default answers
    except those given. Only what Copier reads is copied first (not .venv or .git)."""
    import copier

    source = dest.parent / f"{dest.name}-template"
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    shutil.copy2(ROOT / "copier.yml", source / "copier.yml")
    for folder in ("template", "hooks"):
        if (ROOT / folder).is_dir():
            shutil.copytree(
                ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
            )
    answers.setdefault("package_name", PACKAGE)
    # The parts every project had up to v0.6.0, so that figures compare across releases.
    answers.setdefault("extras", ["preemption", "device_data", "guard"])
    copier.run_copy(str(source), dest, data=answers, defaults=True, unsafe=True, quiet=True)
    shutil.rmtree(source)
    return dest


class Project:
    """A rendered project imported into this process, as `python train.py` would see it:
    its folder first on sys.path and as the working directory while it runs."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()
        self._forget()
        sys.path.insert(0, str(self.path))
        with self.cwd():
            import importlib

            self.train = importlib.import_module("train")
            self.data = importlib.import_module(f"{PACKAGE}.data")
            self.models = importlib.import_module(f"{PACKAGE}.models")
            self.optim = importlib.import_module(f"{PACKAGE}.optim")
            self.schedule = importlib.import_module(f"{PACKAGE}.schedule")
            self.utils = importlib.import_module(f"{PACKAGE}.utils")

    @contextlib.contextmanager
    def cwd(self) -> Iterator[None]:
        old = os.getcwd()
        os.chdir(self.path)
        try:
            yield
        finally:
            os.chdir(old)

    def args(self, *flags: str) -> argparse.Namespace:
        """train.py's flags parsed by its own parser, defaults included."""
        args = self.train.get_args_parser().parse_args(list(flags))
        self.train.check_args(self.train.get_args_parser(), args)
        return args

    def main(self, *flags: str) -> list[dict]:
        """Run train.py's main() with these flags in this process, its console output
        discarded (so that tqdm sees no terminal and stays off, as in a batch job); return
        the rows of its metrics.csv."""
        out_dir = Path(flags[flags.index("--out-dir") + 1])
        shutil.rmtree(out_dir, ignore_errors=True)
        with self.cwd(), silenced():
            self.train.main([*flags, "--fresh"])
        return read_metrics(out_dir)

    def close(self) -> None:
        if str(self.path) in sys.path:
            sys.path.remove(str(self.path))
        self._forget()

    @staticmethod
    def _forget() -> None:
        for name in list(sys.modules):
            if name == "train" or name.split(".")[0] == PACKAGE:
                del sys.modules[name]


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    with open(os.devnull, "w") as null:
        with contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
            yield


def read_metrics(out_dir: Path) -> list[dict]:
    with (out_dir / "metrics.csv").open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def interleave(
    first: Callable[[], float], second: Callable[[], float], repeats: int, label: str = ""
) -> list[tuple[float, float]]:
    """Measure two things in pairs, A B, B A, A B, ...: which one goes first alternates so
    that a warming or cooling machine favours neither. Returns [(a, b), ...]."""
    pairs = []
    for r in range(repeats):
        if r % 2 == 0:
            a = first()
            b = second()
        else:
            b = second()
            a = first()
        log(f"  {label} pair {r + 1}/{repeats}: {a:.4g} vs {b:.4g} (ratio {a / b:.3f})")
        pairs.append((a, b))
    return pairs


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def ratio_cell(values: list[float]) -> str:
    median, low, high = spread(values)
    if len(values) == 1:
        return f"{median:.3f}"
    return f"{median:.3f} ({low:.3f}–{high:.3f})"


def pair_row(label: str, pairs: list[tuple[float, float]]) -> tuple[list[str], float]:
    """A table row for throughputs measured in pairs (A, B): label, A's and B's median
    samples/s, the A / B ratio cell and the number of pairs; and the median ratio."""
    ratios = [a / b for a, b in pairs]
    row = [
        label,
        f"{statistics.median(a for a, _ in pairs):.0f}",
        f"{statistics.median(b for _, b in pairs):.0f}",
        ratio_cell(ratios),
        str(len(pairs)),
    ]
    return row, statistics.median(ratios)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(met: bool, text: str) -> str:
    return f"**Verdict: {'met' if met else 'not met'}** — {text}"


def machine() -> dict[str, str]:
    """CPU model, cores and versions of what the benchmarks ran on."""
    import importlib.metadata as metadata

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    info = {
        "CPU": cpu,
        "cores usable": str(usable),
        "torch threads": str(torch.get_num_threads()),
        "CUDA": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "OS": platform.platform(),
        "python": platform.python_version(),
    }
    for package in ("torch", "torchvision", "lightning", "scikit-learn", "copier"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = "not installed"
    return info
