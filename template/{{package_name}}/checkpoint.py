"""Checkpoints that survive crashes: atomic writes, safe loads, every random state, and the
run's progress; `upgrade` reads the checkpoints of older releases."""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

FORMAT = 2  # of the checkpoint's contents; `upgrade` brings older ones to it


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and the problem."""


@dataclass
class Progress:
    """How far a run has come: saved in every checkpoint, where a resumed run goes on."""

    epoch: int = 0  # epochs completed
    batch: int = 0  # batches done in the current epoch
    step: int = 0  # optimizer steps done
    best_acc: float = -1.0  # best validation accuracy so far


def save_checkpoint(state: dict, path: Path) -> None:
    """Write `state` to `path` atomically: a crash or `kill -9` at any moment leaves either
    the previous file or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # Make the rename itself durable.
    if hasattr(os, "O_DIRECTORY"):
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint written by `save_checkpoint` on the CPU, tensors and plain data only,
    in this release's format."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except Exception as e:  # torn, empty, or not a torch file at all: unpickling fails anyhow
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({reason})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a checkpoint of this project (no model weights)")
    return upgrade(state)


def upgrade(state: dict) -> dict:
    """A checkpoint of an older release, as this one writes them. Format 1 (up to v0.6.0)
    kept the epoch's sums as `meter` and `pending`, the random states as a list over the
    processes and, under DDP since v0.6.0, each process's sums as `process_meters`; before
    v0.5.0 it counted no finite losses and recorded no batch layout (None: any). It did not
    record the seconds the run had taken."""
    if state.get("format", 1) >= FORMAT:
        return state
    state["elapsed_s"] = 0.0  # not recorded: the resumed run counts from its start
    meter = state.pop("meter")
    pending = state.pop("pending", {"losses": [], "bad": []})
    rngs = state.pop("rng")
    shares = state.pop("process_meters", None) or [{"meter": meter, "pending": pending}] * len(rngs)
    processes = [
        {"rng": rng, "sums": format_1_sums(**share)}
        for rng, share in zip(rngs, shares, strict=True)
    ]
    state.update(processes[0])
    if len(processes) > 1:
        state["processes"] = processes
    state.setdefault("batch_layout", None)
    state["format"] = FORMAT
    return state


def format_1_sums(meter: dict, pending: dict) -> dict:
    """EpochSums.state_dict() of a format-1 checkpoint's `meter` and `pending`."""
    totals = {**meter, "finite": meter.get("finite", meter["seen"])}
    return {"totals": totals, "losses": pending["losses"], "bad": pending["bad"]}


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
