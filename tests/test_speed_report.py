"""--speed-report (the speed_report extra) on the cases it must tell apart, on the CPU: a data
set that sleeps in __getitem__ is data-bound and more loader workers are measured faster; a
large model on small in-memory data is compute-bound; a user's .item() in the loss is a
host sync, counted per micro-batch and named with its line; under DDP every process
measures, and the report names the slow one. The report writes nothing but itself."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import re
import shutil
import sys
import time
import unittest.mock

import pytest
import torch
import torch.nn as nn
from torch.utils.data import Dataset, TensorDataset

from tests.helpers import inside, render, run

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
SLEEP_S = 0.002  # per item of the sleepy data set
BATCH = 16


class Sleepy(Dataset):
    """Items that take SLEEP_S each to load, as a slow disk or decoder would."""

    def __init__(self, length: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(length, 1, 40, generator=gen)
        self.targets = torch.randint(10, (length,), generator=gen)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        time.sleep(SLEEP_S)
        return self.inputs[index], self.targets[index]


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    folder = tmp_path_factory.mktemp("speed") / "p"
    return render(template, folder, data="tensors", extras=["speed_report"])


def report_of(project, out_dir, sets=None, model=None, *flags: str, budget=None) -> str:
    """train.py --speed-report run in this process, with these (training, validation) sets
    and model (and the report's time budget); the printed report, which must be the file's
    too. Nothing else is written but the chart, where matplotlib is installed."""
    with inside(project):
        train = importlib.import_module("train")
        info = importlib.import_module("proj.data").DataInfo(10, (1, 40))
        patches = contextlib.ExitStack()
        if budget is not None:
            speed = importlib.import_module("proj.speed")
            patches.enter_context(unittest.mock.patch.object(speed, "BUDGET", budget))
        if sets is not None:
            build = lambda args: (*sets, info)  # noqa: E731
            patches.enter_context(unittest.mock.patch.object(train, "build_dataset", build))
        if model is not None:
            patches.enter_context(unittest.mock.patch.dict(train.MODELS, big=lambda info: model))
        printed = io.StringIO()
        with patches, contextlib.redirect_stdout(printed):
            argv = ["--speed-report", "--batch-size", str(BATCH), "--out-dir", str(out_dir)]
            train.main([*argv, "--device", "cpu", *flags])
    report = (out_dir / "speed-report.md").read_text()
    assert report in printed.getvalue()
    chart = ["speed-report.png"] if importlib.util.find_spec("matplotlib") else []
    assert sorted(path.name for path in out_dir.iterdir()) == ["speed-report.md", *chart]
    return report


def phases_ms(report: str) -> dict[str, float]:
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| \d+% \|", report, re.M)
    return {name: float(ms) for name, ms in rows}


def speed_ups(report: str) -> dict[str, float]:
    """Each speed-up tried: its samples/s against the run as configured."""
    rows = re.findall(r"^\| ([^|]+) \| [\d,]+ \| ([\d.]+)x \|", report, re.M)
    return {name: float(ratio) for name, ratio in rows}


def samples_per_s(report: str) -> float:
    return float(re.search(r"\*\*([\d,]+) samples/s", report).group(1).replace(",", ""))


def test_sleepy_data_is_data_bound_and_more_workers_pay(project, tmp_path):
    out_dir = tmp_path / "out"
    sets = (Sleepy(1024), Sleepy(320))
    report = report_of(project, out_dir, sets, None, "--workers", "0", "--accum-steps", "2")
    phases = phases_ms(report)
    # The loader sleeps BATCH x SLEEP_S per batch, in this process (no workers): a floor
    # under the data phase (two batches a step), which is most of a step of this network.
    assert phases["data"] >= 2 * 1000 * BATCH * SLEEP_S
    assert phases["data"] / sum(phases.values()) > 0.5
    assert "**Data-bound**" in report
    # Two workers sleep side by side: about twice the batches a second.
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the report tries one loader worker")
    assert speed_ups(report)["2 loader workers"] >= 1.4
    assert "`--workers 2`" in report
    assert "- bf16 autocast: the run is data-bound" in report
    # Without workers no more than 1 / SLEEP_S items a second load; the network's own time is
    # small beside the sleeps (the floor leaves room for a loaded machine's late wake-ups).
    assert 0.4 / SLEEP_S < samples_per_s(report) <= 1 / SLEEP_S
    # A step is two micro-batches: its items a second agree with its phases' time.
    step_s = sum(phases.values()) / 1000
    assert 0.75 < samples_per_s(report) * step_s / (2 * BATCH) < 1.5
    # Evaluation sleeps over 320 items where an epoch sleeps over 1024: about 24 % of the
    # time (a few of its 10 batches timed, for all of them).
    share = int(re.search(r"- Evaluation: about (\d+)% of an epoch's time", report).group(1))
    assert 15 <= share <= 32, report


def test_a_large_model_on_data_in_memory_is_compute_bound(project, tmp_path):
    width = 1024
    model = nn.Sequential(nn.Flatten(), nn.Linear(40, width), nn.ReLU())
    model.extend([nn.Linear(width, width), nn.ReLU()] * 3).append(nn.Linear(width, 10))
    data = TensorDataset(torch.randn(576, 1, 40), torch.randint(10, (576,)))
    sets = torch.utils.data.random_split(data, [512, 64])
    sets = [TensorDataset(*data[subset.indices]) for subset in sets]
    report = report_of(project, tmp_path / "out", sets, model, "--model", "big")
    phases = phases_ms(report)
    compute = phases["forward"] + phases["backward"] + phases["optimizer"]
    assert compute / sum(phases.values()) > 0.85
    assert phases["forward"] > 0.5 and phases["backward"] > phases["forward"]  # twice the work
    assert "**Compute-bound**" in report
    assert "Host syncs in a step: none." in report  # the loop's own step has none
    assert "- more loader workers: the batches do not come from a loader" in report
    assert "- whole batches from memory: on already" in report
    assert set(speed_ups(report)) == {"bf16 autocast", "twice the batch, twice the lr"}
    assert "`--batch-size 32 --lr " in report


def test_a_speed_up_the_data_cannot_take_is_listed_not_tried(project, tmp_path):
    """24 training items make a batch of 16 and none of 32: the report lists twice the batch
    under "Not tried" with the reason, and reports the rest."""
    sets = [TensorDataset(torch.randn(n, 1, 40), torch.randint(10, (n,))) for n in (24, 16)]
    report = report_of(project, tmp_path / "out", sets, None, "--workers", "0", budget=5.0)
    assert (
        "- twice the batch, twice the lr: failed: 24 training items make no full batch of 32: "
        "give --batch-size 24 or less"
    ) in report
    assert samples_per_s(report) > 0


def test_a_host_sync_in_the_loss_is_counted_and_named(project, tmp_path):
    """A user's check of the loss's value (an .item() a micro-batch): with 3 micro-batches a
    step, 3 syncs, at the line the user wrote. With its time spent (a budget of 0 s), the
    report tries no speed-up and says why."""
    edited = shutil.copytree(project, tmp_path / "edited")
    source = (edited / "train.py").read_text()
    head = "def compute_loss("
    body = source[source.index(head) :]
    returned = body.index("    return F.cross_entropy")
    check = (
        "    if (loss := F.cross_entropy(outputs, targets)).item() > 1e6:\n        print(loss)\n"
    )
    source = source.replace(body, body[:returned] + check + body[returned:])
    (edited / "train.py").write_text(source)
    line = source[: source.index(check)].count("\n") + 1
    report = report_of(edited, tmp_path / "out", None, None, "--accum-steps", "3", budget=0)
    assert "Host syncs in a step: 3**" in report
    assert f"train.py:{line} (compute_loss: item) x3" in report
    assert "None applied to this run." in report
    spent = "the report had used its 0 s"
    assert f"- twice the batch, twice the lr: {spent}" in report
    assert f"- bf16 autocast: {spent}" in report


@pytest.mark.slow
def test_every_process_measures_and_the_slow_one_is_named(template, tmp_path):
    """Two torchrun processes; rank 1 sleeps 20 ms in each loss. Each measures its own steps
    alone, and the report (written once, by rank 0) names rank 1."""
    project = render(template, tmp_path / "p", data="tensors", distributed="ddp",
                     extras=["speed_report", "guard"])  # fmt: skip
    source = (project / "train.py").read_text()
    head = "def compute_loss("
    body = source[source.index(head) :]
    returned = body.index("    return F.cross_entropy")
    slow = "    if os.environ.get('RANK') == '1':\n        time.sleep(0.02)\n"
    (project / "train.py").write_text(
        source.replace(body, body[:returned] + slow + body[returned:])
    )
    out_dir = tmp_path / "out"
    flags = ["--speed-report", "--device", "cpu", "--batch-size", "16", "--out-dir", out_dir]
    result = run(sys.executable, *TORCHRUN, "train.py", *flags, cwd=project, timeout=300)
    report = (out_dir / "speed-report.md").read_text()
    assert report in result.stdout and result.stdout.count("# Speed report") == 1
    speeds = re.search(r"alone \(without DDP\): rank 0: ([\d,]+), rank 1: ([\d,]+)", report)
    rank0, rank1 = (float(s.replace(",", "")) for s in speeds.groups())
    assert rank1 < 0.9 * rank0
    assert "**rank 1 is the slowest**" in report
    assert sorted(p.name for p in out_dir.iterdir()) == ["speed-report.md"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--eval-only"], "not allowed with --eval-only (it times training)"),
        (["--lr", "auto"], "not with --find-lr or --lr auto, whose sweep writes its curve"),
        (["--find-lr"], "not with --find-lr or --lr auto, whose sweep writes its curve"),
    ],
)
def test_flags_that_would_write_or_not_train_are_refused(finders_project, flags, message):
    result = run(
        sys.executable, "train.py", "--speed-report", *flags, cwd=finders_project, check=False
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"train.py: error: argument --speed-report: {message}"
        + ("" if "eval" in message else ": give the --lr to time")
    ]


@pytest.fixture(scope="module")
def finders_project(template, tmp_path_factory):
    folder = tmp_path_factory.mktemp("speed-finders") / "p"
    return render(template, folder, data="tensors", extras=["speed_report", "finders"])
