"""Checkpoints that survive crashes: atomic writes, safe loads, every RNG state."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import torch


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def save_checkpoint(state: dict, path: Path) -> None:
    """Write `state` to `path` atomically: a crash or `kill -9` at any moment leaves either
    the previous file or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
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
    """Load a checkpoint written by `save_checkpoint` on the CPU, tensors and plain data only."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except Exception as e:  # torn, empty, or not a torch file at all: unpickling fails anyhow
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({reason})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a checkpoint of this project (no model weights)")
    return state


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
