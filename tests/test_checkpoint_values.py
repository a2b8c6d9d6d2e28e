"""What the checkpoints hold, by value: best.pt the epoch and the weights of the best row of
metrics.csv (by train.score) and last.pt the last's; and an fp16 run stopped part-way resumes
to the very state an unbroken run reaches, the GradScaler's scale and growth tracker too.
The rendered train.py runs in this process."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from tests.helpers import TINY_RUN, inside, read_metrics, render
from tests.test_resume import same_training, stop_at_step, without_speed

RUN = [*TINY_RUN, "--model", "mlp", "--image-size", "8", "--device", "cpu", "--deterministic"]


def train_main(project, flags) -> None:
    with inside(project):
        import train

        train.main([str(flag) for flag in flags])


# The runs' validation accuracy goes up and down (19 validation images): the best epoch is
# neither the first nor the last, and neither the one of the highest or lowest loss. With
# EMA the score is the average's accuracy, whose best epoch (3) is not the weights' (2).
SCORES = {
    "accuracy": ([], ["--seed", "0"], "val_acc"),
    "EMA's accuracy": (["ema"], ["--seed", "11"], "ema_val_acc"),
}


@pytest.mark.parametrize("extras, flags, scored", SCORES.values(), ids=SCORES.keys())
def test_best_pt_holds_the_best_rows_epoch_and_weights(
    template, tmp_path, capsys, extras, flags, scored
):
    project = render(template, tmp_path / "p", extras=extras)
    out = tmp_path / "out"
    train_main(project, [*RUN, *flags, "--epochs", "6", "--out-dir", out])
    rows = read_metrics(out)
    assert [row["epoch"] for row in rows] == [1, 2, 3, 4, 5, 6]
    best_row = max(rows, key=lambda row: row[scored])  # the first of equals: later is no better
    by = {name: max(rows, key=lambda row: row[name])["epoch"] for name in ("val_acc", "val_loss")}
    by["lowest val_loss"] = min(rows, key=lambda row: row["val_loss"])["epoch"]
    # Not trivial: a best.pt of the last epoch, or of another measure, would not pass.
    assert best_row["epoch"] not in (1, 6, by["val_loss"], by["lowest val_loss"]), (by, rows)
    if scored != "val_acc":
        assert best_row["epoch"] != by["val_acc"], rows

    best = torch.load(out / "best.pt", weights_only=True)
    last = torch.load(out / "last.pt", weights_only=True)
    assert best["progress"]["epoch"] == best_row["epoch"]
    assert best["progress"]["best"] == best_row[scored]
    assert len(best["progress"]["history"]) == best_row["epoch"]
    assert last["progress"]["epoch"] == 6 and last["progress"]["best"] == best_row[scored]
    assert any(not torch.equal(best["model"][k], v) for k, v in last["model"].items())

    # Their weights, evaluated afresh, give the metrics of their rows.
    capsys.readouterr()
    for checkpoint, row in (("best.pt", best_row), ("last.pt", rows[-1])):
        evaluated = [*RUN, *flags, "--eval-only", "--init-weights", out / checkpoint]
        train_main(project, [*evaluated, "--out-dir", tmp_path / f"eval-{checkpoint}"])
        shown = capsys.readouterr().out.strip().splitlines()[-1]
        metrics = dict(re.findall(r"val_(\w+) (\S+)", shown))
        assert metrics.keys() == {"loss", "acc"}, shown
        for name, value in metrics.items():
            assert float(value) == pytest.approx(row[f"val_{name}"], abs=1e-6), (checkpoint, name)
    # Equal scores: the first epoch of them stays best (a rate too small to move a weight).
    still = tmp_path / "still"
    train_main(project, [*RUN, *flags, "--lr", "1e-30", "--epochs", "3", "--out-dir", still])
    assert len({row[scored] for row in read_metrics(still)}) == 1
    assert torch.load(still / "best.pt", weights_only=True)["progress"]["epoch"] == 1


FP16 = [*RUN, "--amp", "fp16", "--synthetic-size", "160", "--epochs", "2", "--log-interval", "1"]
INIT_SCALE = 2.0**16  # torch's
# The signal comes as the 11th step that the scaler takes begins: part-way through epoch 2
# (the scaler skips a step or two of the first 12, whose gradients overflowed).
STOP_AT = 11


def test_an_fp16_run_stopped_part_way_resumes_bit_identically(template, tmp_path, monkeypatch):
    """The scaler doubles its scale after every 3 steps without overflow (torch's default is
    2000) and halves it at an overflow: its state moves all along the run, so a resumed run
    that did not take it back from the checkpoint (a fresh scaler) would not go on the same."""
    monkeypatch.setattr(
        torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, growth_interval=3)
    )
    project = render(template, tmp_path / "p", amp="fp16", extras=["preemption"])
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    train_main(project, [*FP16, "--out-dir", whole])

    with inside(project):
        import train

        stop_at_step(train, [*map(str, FP16), "--out-dir", str(stopped)], STOP_AT)
    at_stop = torch.load(stopped / "last.pt", weights_only=True)
    assert at_stop["progress"]["epoch"] == 1 and at_stop["progress"]["batch"] > 0  # part-way
    # What the resumed run must take back is not what a fresh scaler has.
    assert at_stop["scaler"]["scale"] != INIT_SCALE
    assert at_stop["scaler"]["_growth_tracker"] != 0

    train_main(project, [*FP16, "--out-dir", stopped])
    same_training(whole / "last.pt", stopped / "last.pt")
    a = torch.load(whole / "last.pt", weights_only=True)["scaler"]
    b = torch.load(stopped / "last.pt", weights_only=True)["scaler"]
    assert (b["scale"], b["_growth_tracker"]) == (a["scale"], a["_growth_tracker"])
    assert a == b  # its settings too
    assert a["scale"] != INIT_SCALE  # the scale moved during the run
    assert without_speed(read_metrics(stopped)) == without_speed(read_metrics(whole))


class NaNGradients(torch.nn.Module):
    """Finite outputs whose gradients are NaN: a division guarded by torch.where, whose
    branch not taken still backpropagates 0 x inf."""

    def __init__(self, info) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(192, info.num_classes)

    def forward(self, x):
        y = self.fc(x.flatten(1))
        zero = torch.zeros_like(y)
        return torch.where(zero == 0, y, y / zero)


def test_fp16_steps_skipped_for_good_are_named_on_the_epoch_line(template, tmp_path, capsys):
    """GradScaler skips a step whose gradients are not finite, and halves its scale: past
    16 skips more than good steps it is below 1, where nothing trains, and the epoch says so."""
    project = render(template, tmp_path / "p", amp="fp16", extras=[])
    flags = [*RUN, "--amp", "fp16", "--synthetic-size", "320", "--epochs", "2", "--model", "nan"]
    with inside(project):
        from proj import models

        models.MODELS["nan"] = NaNGradients
        import train

        train.main([*flags, "--out-dir", str(tmp_path / "out")])
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epo")]
        train.main([*flags, "--model", "mlp", "--out-dir", str(tmp_path / "mlp")])
    assert "FP16" not in capsys.readouterr().out  # a model that trains: not a word
    # 20 steps an epoch, every one skipped: 2**16 halved 20 and 40 times.
    assert [line.split("  FP16 SKIPS STEPS ")[1:] for line in lines] == [
        ["(loss scale 0.0625): gradients NaN, or past float16"],
        ["(loss scale 5.96e-08): gradients NaN, or past float16"],
    ]
