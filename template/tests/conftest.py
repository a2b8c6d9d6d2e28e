"""Shared set-up: import the project as `python train.py` would, on one CPU thread."""

from __future__ import annotations

import importlib.util
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


def pytest_sessionstart(session):
    """Conflict markers left by `copier update` break the import of the file that holds them,
    and with it the collection of other tests: name the conflicted files first, and stop."""
    check = Path(__file__).with_name("test_no_conflicts.py")
    if not check.is_file():
        return
    spec = importlib.util.spec_from_file_location("no_conflicts", check)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    problems = module.conflicted_files() + module.rejected_files()
    if problems:
        pytest.exit(f"unresolved conflicts of copier update in: {', '.join(problems)}", 1)
