"""Small helpers: flag types that explain themselves, seeding, devices."""

from __future__ import annotations

import argparse
import copy
import os
import random
import signal

import torch


class ArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, without the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_at_least(low: int, at_most: int | None = None):
    bounds = f">= {low}" if at_most is None else f">= {low} and <= {at_most}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer {bounds}, got {text!r}") from None
        if value < low or (at_most is not None and value > at_most):
            raise argparse.ArgumentTypeError(f"must be an integer {bounds}, got {text!r}")
        return value

    return parse


def float_in(
    low: float, high: float = float("inf"), *, low_open: bool = False, high_open: bool = False
):
    """A float in [low, high]; low_open and high_open leave out either end."""
    bounds = f"{'>' if low_open else '>='} {low}"
    if high < float("inf"):
        bounds += f" and {'<' if high_open else '<='} {high}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {bounds}, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if too_low or too_high or value != value:
            raise argparse.ArgumentTypeError(f"must be a number {bounds}, got {text!r}")
        return value

    return parse


def or_auto(parse):
    """A flag type that takes what `parse` takes, or the word auto (found at run time)."""

    def parse_or_auto(text: str):
        if text == "auto":
            return text
        try:
            return parse(text)
        except argparse.ArgumentTypeError as error:
            wanted = str(error).split(", got ")[0]  # "must be a number > 0"
            raise argparse.ArgumentTypeError(f"{wanted} or auto, got {text!r}") from None

    return parse_or_auto


def cpu_count() -> int:
    """CPUs this process may run on (respects taskset, cgroups' affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        # cuBLAS needs this to be reproducible; it is read when the first handle is made.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    # benchmark picks the fastest convolution for fixed input shapes, but not reproducibly.
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    # TF32 matmuls on Ampere and newer: much faster, accurate enough for training.
    torch.backends.cuda.matmul.allow_tf32 = not deterministic
    torch.backends.cudnn.allow_tf32 = not deterministic


class EMA:
    """Exponential moving average of a model's weights, for evaluation and export.

    The decay ramps up over the first steps, so the average is not dominated by the random
    initial weights. Buffers (BatchNorm statistics) are copied, not averaged.
    """

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay
        self.updates = 0

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        averaged = [p for p in self.module.parameters() if p.dtype.is_floating_point]
        current = [p for p in model.parameters() if p.dtype.is_floating_point]
        torch._foreach_lerp_(averaged, current, 1 - decay)
        for mine, theirs in zip(self.module.buffers(), model.buffers(), strict=True):
            mine.copy_(theirs)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = state["updates"]


class StopSignal:
    """Remembers SIGTERM and SIGUSR1, which SLURM and cloud schedulers send before they stop
    a job, so that training can finish its step, checkpoint and exit cleanly."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def __enter__(self) -> StopSignal:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Stopped(Exception):
    """Training stopped early on purpose (a signal, or too many non-finite losses)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# Exit status after a checkpoint on SIGTERM/SIGUSR1: "temporary failure, try again"
# (EX_TEMPFAIL), which tells a job scheduler to run the job again.
REQUEUE_EXIT = 75


def non_finite(loss: torch.Tensor) -> torch.Tensor:
    """1.0 if `loss` (detached) is NaN or infinite, else 0.0: a float32 tensor on the loss's
    device, the form fused optimizers take as `found_inf`. No host sync, and two small
    kernels where torch.isfinite takes several: x - x is 0 for a finite x and NaN for the
    rest, and only NaN differs from itself. Both kernels take tensors only (an operand that
    is a Python number costs a conversion on every call), and a float32 loss is not cast."""
    if loss.dtype != torch.float32:
        loss = loss.float()
    diff = loss - loss
    return diff.ne_(diff)


class NonFiniteGuard:
    """Keeps a step whose loss was not finite away from the model, without a host sync.

    The buffers (BatchNorm statistics) are copied before the step's forward
    passes and put back after a bad step. A fused optimizer (SGD, Adam, AdamW, Adagrad where
    the device has the kernel) is told through `found_inf` and skips the step itself: its
    weights and state stay exactly as they were. Any other optimizer gets zero gradients and
    its weights put back from a copy (its running averages still decay by one step). Under
    fp16 loss scaling (`scaler_skips`), the GradScaler already skips every step whose
    gradients are not finite, as they are after a non-finite loss, so the guard leaves the
    optimizer alone and only puts the buffers back: an overflow in the forward pass has
    written inf or NaN into them by then.

    `bad` is the window's flag from `non_finite`: 1.0 for a bad step, 0.0 for a good one."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler_skips: bool = False
    ) -> None:
        self.optimizer = optimizer
        self.in_kernel = not scaler_skips and bool(optimizer.defaults.get("fused"))
        params = [p for p in model.parameters() if p.requires_grad]
        self.params = [] if self.in_kernel or scaler_skips else params
        self.buffers = list(model.buffers())  # BatchNorm statistics and step counts
        self.params_before = [torch.empty_like(p) for p in self.params]
        self.buffers_before = [torch.empty_like(b) for b in self.buffers]

    # The early returns skip torch.no_grad, whose entry and exit cost more than the check.
    def start_window(self) -> None:
        if self.buffers:
            with torch.no_grad():
                torch._foreach_copy_(self.buffers_before, self.buffers)

    def before_step(self, bad: torch.Tensor) -> None:
        if self.in_kernel:
            self.optimizer.found_inf = bad  # the fused kernel skips the step when 1
            return
        if not self.params:
            return
        bad = bad.bool()
        with torch.no_grad():
            for param in self.params:
                if param.grad is not None:
                    param.grad.masked_fill_(bad, 0.0)
            torch._foreach_copy_(self.params_before, self.params)

    def after_step(self, bad: torch.Tensor) -> None:
        tensors = self.params + self.buffers
        if not tensors:
            return
        # torch.where, not arithmetic: a bad step may have left NaN or inf behind (in the
        # BatchNorm statistics, or in the weights when the learning rate is absurd).
        bad = bad.bool()
        with torch.no_grad():
            befores = self.params_before + self.buffers_before
            for tensor, before in zip(tensors, befores, strict=True):
                torch.where(bad, before, tensor, out=tensor)
