"""Your own data, model and loss, plugged in as the rendered README shows (its code, pasted
into data.py and models.py as a user would), then trained the ways the template promises
they keep working: two DDP processes, mixed precision, both finders, and a resume part-way
through an epoch that ends bit for bit where an unbroken run does."""

from __future__ import annotations

import re
import signal
import sys

import pytest

from tests.helpers import read_metrics, render, run
from tests.test_resume import TORCHRUN, interrupt_at, same_training

PY = sys.executable
SIGNALS = ["--data", "signals", "--model", "signalnet", "--device", "cpu", "--workers", "0"]


def readme_code(project, section: str) -> list[str]:
    text = (project / "README.md").read_text()
    text = text[text.index(f"## {section}\n") :]
    return re.findall(r"```python\n(.*?)```", text[: text.index("\n## ", 1)], flags=re.S)


def plug_in(project):
    """Paste the README's Signals class and build_dataset branch into data.py, and its
    SignalNet into models.py."""
    signals, branch = readme_code(project, "Your own data")[:2]
    data = project / "proj/data.py"
    text = data.read_text()
    new_branch = branch.split("\n", 1)[1]  # below `def build_dataset(args):`
    new_branch = new_branch[: new_branch.index("    elif")]
    text = text.replace(
        '    if args.data == "synthetic":', new_branch + '    elif args.data == "synthetic":'
    )
    text = text.replace('DATASETS = ("synthetic",', 'DATASETS = ("signals", "synthetic",')
    data.write_text(text + "\n\n" + signals)
    models = project / "proj/models.py"
    models.write_text(models.read_text() + "\n\n" + readme_code(project, "Your own model")[0])
    return project


@pytest.fixture(scope="module")
def ddp_project(template, tmp_path_factory):
    project = render(
        template,
        tmp_path_factory.mktemp("own") / "p",
        distributed="ddp",
        amp="bf16",
        extras=["preemption", "finders"],
    )
    return plug_in(project)


def test_signals_train_on_two_processes_with_mixed_precision(ddp_project, tmp_path):
    flags = [*SIGNALS, "--amp", "bf16", "--batch-size", "32", "--epochs", "3"]
    result = run(*TORCHRUN, "train.py", *flags, "--out-dir", tmp_path, cwd=ddp_project)
    assert (
        "2 x cpu" in result.stdout
        and "signalnet on signals (2048 train, 512 val items)" in result.stdout
    )
    rows = read_metrics(tmp_path)
    assert rows[-1]["val_acc"] > 50  # chance: 25 %


def test_both_finders_fit_the_signals(ddp_project, tmp_path):
    flags = [*SIGNALS, "--batch-size", "auto", "--lr", "auto", "--find-lr-steps", "30"]
    result = run(
        *TORCHRUN, "train.py", *flags, "--epochs", "1", "--out-dir", tmp_path, cwd=ddp_project
    )
    # 1024 signals a process: batches of 64 at most leave 16 steps an epoch.
    assert "batch size finder: 64 fit, the most that leaves 16 steps an epoch" in result.stdout
    assert "suggested lr" in result.stdout
    assert len(read_metrics(tmp_path)) == 1


def test_signals_resume_part_way_bit_identically(ddp_project, tmp_path):
    flags = [
        *SIGNALS,
        "--batch-size",
        "64",
        "--epochs",
        "2",
        "--deterministic",
        "--log-interval",
        "1",
    ]
    run(*TORCHRUN, "train.py", *flags, "--out-dir", tmp_path / "whole", cwd=ddp_project)
    cmd = [*TORCHRUN, "train.py", *flags, "--out-dir", str(tmp_path / "stopped")]
    status = interrupt_at(cmd, ddp_project, 20, signal.SIGTERM, markers=2)  # epoch 2, step 5
    assert status != 0
    result = run(*cmd, cwd=ddp_project)
    assert "resumed from" in result.stdout and "1 epoch done, step 21" in result.stdout
    same_training(tmp_path / "whole/last.pt", tmp_path / "stopped/last.pt")
