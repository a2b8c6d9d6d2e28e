"""Shared set-up: import the project as `python train.py` would, on one CPU thread."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `import train` and the package, however pytest is started

# The tests use tiny models: more threads would only add overhead.
torch.set_num_threads(1)


@pytest.fixture
def parse():
    """Parse train.py's flags, as on its command line: every default is the real one."""
    from train import get_args_parser

    return lambda *flags: get_args_parser().parse_args([str(flag) for flag in flags])
