"""Training steps do not wait for the device: the host reads a tensor only every
--log-interval optimizer steps.

The rendered train.py's `main` runs in this process under a TorchFunctionMode that records
every call that copies a tensor's value to the host (`.item()`, `.tolist()`, `.cpu()`,
`.numpy()`, and `bool()`, `float()`, `int()`, `format()`, indexing with a tensor). On a GPU
each of these blocks the host until the device has caught up; on this CPU-only machine the
calls are counted all the same. Only calls made from within `train_one_epoch` count: evaluation
and the end of an epoch may read values. Loading data on the host (the DataLoader, its sampler
and the data set, which build CPU tensors) is not a device sync and is left out; moving the
batches to the device and everything after is not.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.helpers import WITH_EMA, inside, render

SYNCS = {
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__complex__",
    "__format__",
}
HOST_DATA_LOADING = str(Path(torch.utils.data.__file__).parent)


class CountSyncs(TorchFunctionMode):
    """Records (name, optimizer step) for each host sync made within train_one_epoch, and
    counts the others."""

    def __init__(self, train_py: Path) -> None:
        super().__init__()
        self.train_py = str(train_py)
        self.in_epoch: list[tuple[str, int]] = []
        self.elsewhere = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNCS:
            self.record(name)
        return func(*args, **(kwargs or {}))

    def record(self, name: str) -> None:
        epoch_frame = None
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if code.co_filename.startswith(HOST_DATA_LOADING):
                return  # the DataLoader producing a batch on the host
            if code.co_name == "train_one_epoch" and code.co_filename == self.train_py:
                epoch_frame = frame
                break
            frame = frame.f_back
        if epoch_frame is None:
            self.elsewhere += 1
        else:
            self.in_epoch.append((name, epoch_frame.f_locals["progress"].step))


@pytest.fixture(scope="module")
def projects(template, tmp_path_factory):
    rendered = {}

    def get(amp: str) -> Path:
        if amp not in rendered:
            rendered[amp] = render(template, tmp_path_factory.mktemp(amp), amp=amp, extras=WITH_EMA)
        return rendered[amp]

    return get


def run_main(project: Path, out_dir: Path, flags: list[str]) -> CountSyncs:
    with inside(project):
        import train as project_train

        counter = CountSyncs(project / "train.py")
        with counter:
            project_train.main(["--out-dir", str(out_dir), "--fresh", *flags])
    return counter


# 320 images in batches of 16: 20 batches an epoch.
BASE = ["--synthetic-size", "320", "--batch-size", "16", "--epochs", "1", "--workers", "0"]
BASE += ["--model", "mlp", "--device", "cpu", "--log-interval", "5"]


@pytest.mark.parametrize(
    ("amp", "flags", "logged_steps"),
    [
        ("off", [], [5, 10, 15, 20]),
        ("off", ["--data-on-device", "off"], [5, 10, 15, 20]),  # the loader path
        ("off", ["--accum-steps", "2"], [5, 10]),  # 10 optimizer steps
        ("off", ["--log-interval", "3"], [3, 6, 9, 12, 15, 18]),
        ("bf16", ["--amp", "bf16"], [5, 10, 15, 20]),
        ("bf16", ["--amp", "bf16", "--accum-steps", "3", "--clip-grad", "1"], [5]),
    ],
    ids=["off", "off-loader", "off-accum", "off-interval3", "bf16", "bf16-accum-ema-clip"],
)
def test_syncs_only_at_log_intervals(projects, tmp_path, amp, flags, logged_steps):
    counter = run_main(projects(amp), tmp_path / "run", [*BASE, *flags])
    assert (tmp_path / "run" / "last.pt").is_file(), "the run did not finish"
    # One value read per log interval, at the optimizer step that ends the interval.
    assert [step for _, step in counter.in_epoch] == logged_steps, counter.in_epoch
    # The counter sees what happens outside the epoch too (evaluation reads its totals).
    assert counter.elsewhere > 0


def test_counter_sees_every_kind_of_sync():
    t, index = torch.tensor([1.5]), torch.tensor(1)
    counter = CountSyncs(Path(__file__))
    with counter:
        t.item()
        t.tolist()
        t.cpu()
        t.numpy()
        bool(t)
        float(t)
        int(t)
        complex(t)
        format(t[0], ".2f")
        [0, 1][index]  # noqa: B018
        if t > 1:
            pass
    assert counter.elsewhere == 11  # not in a train_one_epoch: counted apart
    assert counter.in_epoch == []


def train_one_epoch(progress):
    """Stands in for train.py's function of that name, for the checks of the counter."""
    loss = torch.tensor(0.5)
    for progress.step in range(1, 4):
        loss.item()  # one host sync per step


def test_counter_attributes_syncs_to_train_one_epoch():
    counter = CountSyncs(Path(__file__))
    with counter:
        train_one_epoch(SimpleNamespace(step=0))
    assert counter.in_epoch == [("item", 1), ("item", 2), ("item", 3)]
    assert counter.elsewhere == 0
