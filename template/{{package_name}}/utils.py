"""Small helpers: flag types that explain themselves, seeding, devices, the output folder."""

from __future__ import annotations

import argparse
import math
import os
import random
import secrets
from pathlib import Path

import torch


class ArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, without the usage block. Once the flags
    are parsed it runs `checks`: functions of them all that return what is wrong, or None
    (the run flags' below, and those that modules adding flags append)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.checks = [run_flags_problem]

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        for check in self.checks:
            if problem := check(parsed):
                self.error(problem)
        return parsed, rest

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_flags_problem(args) -> str | None:
    """What contradicts itself among the run flags of train.py, or None."""
    for flag, folder in (("--out-dir", args.out_dir), ("--data-dir", args.data_dir)):
        if not folder.strip():
            return f"argument {flag}: must name a folder, got {folder!r}"
    if (Path(args.out_dir) / "train.py").exists():
        return f"argument --out-dir: {args.out_dir} holds train.py: give runs a folder of their own"
    if args.resume and args.fresh:
        return "argument --fresh: not allowed with --resume (one starts over, the other goes on)"
    return None


def int_at_least(low: int, at_most: int | None = None):
    """A flag type: an integer >= low (and <= at_most)."""
    return _bounded(int, "an integer", low, math.inf if at_most is None else at_most)


def float_in(low: float, high: float = math.inf, *, low_open=False, high_open=False):
    """A flag type: a number in [low, high] that is finite as a float32, which is what the
    model and the optimizer compute in; low_open and high_open leave out an end."""
    return _bounded(float, "a number", low, high, low_open, high_open)


def _bounded(kind: type, noun: str, low, high, low_open=False, high_open=False):
    shown = str if kind is int else "{:g}".format  # 4294967295, not 4.29497e+09
    bounds = f"{'>' if low_open else '>='} {shown(low)}"
    if high < math.inf:
        bounds += f" and {'<' if high_open else '<='} {shown(high)}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {noun} {bounds}, got {text!r}") from None
        if not abs(value) <= torch.finfo(torch.float32).max:  # inf, NaN, or so as a float32
            raise argparse.ArgumentTypeError(f"must be a finite number {bounds}, got {text!r}")
        if outside(value):
            raise argparse.ArgumentTypeError(f"must be {noun} {bounds}, got {text!r}")
        if kind is float and outside(single := torch.tensor(value, dtype=torch.float32)):
            raise argparse.ArgumentTypeError(
                f"must be {noun} {bounds}, got {text!r}, which is {single:g} as a float32"
            )
        return value

    def outside(value) -> bool:
        too_high = value >= high if high_open else value > high
        return (value <= low if low_open else value < low) or too_high

    return parse


def device_name(text: str) -> str:
    """A flag type: auto, cpu, cuda, cuda:N or mps, where this machine has it."""
    kind, colon, index = text.partition(":")
    if text not in ("auto", "cpu", "cuda", "mps") and not (kind == "cuda" and index.isdigit()):
        raise argparse.ArgumentTypeError(
            f"unknown device {text!r}: use auto, cpu, cuda, cuda:N (N counts from 0) or mps"
        )
    if kind == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("CUDA is not available on this machine")
    if colon and int(index) >= (count := torch.cuda.device_count()):
        raise argparse.ArgumentTypeError(
            f"no device {text}: this machine has {count} CUDA device{'s' if count > 1 else ''}, "
            f"cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}"
        )
    if kind == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError("MPS (Apple's GPUs) is not available on this machine")
    return text


def existing_file(text: str) -> Path:
    """A flag type: the path of a file that exists."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    return Path(text)


def cpu_count() -> int:
    """CPUs this process may run on (respects taskset, cgroups' affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def pick_device(name: str) -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def restarted_job() -> bool:
    """Whether this process runs a job's command again: torchrun restarting it after a failure,
    or SLURM after a requeue."""
    names = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
    return any(os.environ.get(name, "0") not in ("", "0") for name in names)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        # cuBLAS needs this to be reproducible; it is read when the first handle is made.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if deterministic != torch.are_deterministic_algorithms_enabled():  # imports the compiler
        torch.use_deterministic_algorithms(deterministic)
    # benchmark picks the fastest convolution for fixed input shapes, but not reproducibly.
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    # TF32 matmuls on Ampere and newer: much faster, accurate enough for training.
    torch.backends.cuda.matmul.allow_tf32 = not deterministic
    torch.backends.cudnn.allow_tf32 = not deterministic


def all_finite(module: torch.nn.Module) -> bool:
    """Whether every floating-point weight and buffer of `module` is finite (one host sync)."""
    tensors = [t for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]
    return bool(torch.stack([t.isfinite().all() for t in tensors]).all())


def write_atomically(path: Path, write) -> None:
    """Write `path` through `write(f)`, f a binary file, so that a crash or `kill -9` at any
    moment leaves the old file or the new one, never a torn one: a temporary file beside it,
    flushed to the disk, takes its place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask's mode, as open()
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class Stopped(Exception):
    """Training stopped early on purpose; the message says why, exit_code how."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


_held_out_dirs: list = []  # open lock files: closing one would release its lock


def hold_out_dir(out_dir: Path) -> str | None:
    """Make <out-dir>, lock <out-dir>/.lock for as long as this process runs, and remove what
    a killed save left behind. Returns what is wrong instead when the folder cannot be written
    or another process holds it (two runs would mix their checkpoints and metrics). The
    system releases the lock when the process ends, however it ends."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        f = (out_dir / ".lock").open("a")
    except OSError as error:
        return f"cannot write to {out_dir} ({error.strerror or error})"
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        return None
    try:
        # A POSIX record lock: another process is refused, this one may take it again.
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return f"another run is using {out_dir}; wait or pick another"
    _held_out_dirs.append(f)
    for leftover in out_dir.glob(".*.tmp"):  # from a save killed half-way
        leftover.unlink()
    return None


class UserError(Exception):
    """A problem the user can fix: train.py reports its message in one line, no traceback."""

    def __init__(self, message: str) -> None:
        if message.startswith("Caught ") and "\nOriginal Traceback" in message:
            # From a loader worker, raised again with its traceback: the last line is ours.
            kind = f"{type(self).__module__}.{type(self).__qualname__}: "
            message = message.strip().splitlines()[-1].removeprefix(kind)
        super().__init__(message)


class DataError(UserError):
    """A problem with the data (a missing folder, say)."""
