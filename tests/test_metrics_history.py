"""metrics.csv never loses a run's history: it is written whole and atomically, the
checkpoints keep its rows, and a resumed run writes it again when it is missing, torn or
edited. A file that cannot be read where it is needed is one line before any training."""

from __future__ import annotations

import math
import os
import shutil
import unittest.mock

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import TINY_RUN, inside, read_metrics, render, train

RUN = [*TINY_RUN, "--model", "mlp", "--deterministic"]


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("history") / "p")


@pytest.fixture(scope="module")
def two_epochs(project):
    """A run of two epochs: its out-dir, metrics.csv's text, and the training losses of its
    steps, in order."""
    real, losses = F.cross_entropy, []

    def recorded(*args, **kwargs):
        loss = real(*args, **kwargs)
        if torch.is_grad_enabled():  # training, not evaluation
            losses.append(loss.item())
        return loss

    with unittest.mock.patch.object(F, "cross_entropy", recorded):
        rows = train(project, *RUN)
    assert [row["epoch"] for row in rows] == [1, 2]
    out = project / "runs/test"
    return out, (out / "metrics.csv").read_text(), losses


def test_train_loss_is_the_mean_of_its_epochs_losses(two_epochs):
    """96 images in batches of 16: 6 steps an epoch, each epoch's row the mean of its own."""
    out, _, losses = two_epochs
    assert len(losses) == 12
    rows = read_metrics(out)
    for row, epoch in zip(rows, (losses[:6], losses[6:]), strict=True):
        assert row["train_loss"] == pytest.approx(sum(epoch) / 6, rel=1e-9)


def resumed(project, two_epochs, tmp_path, change) -> list[dict]:
    """The rows after a resume to a third epoch, from a copy of the run whose metrics.csv
    `change` (a function of its path) has damaged."""
    out = tmp_path / "out"
    shutil.copytree(two_epochs[0], out)
    change(out / "metrics.csv")
    train(project, *RUN, "--epochs", "3", "--out-dir", str(out))
    return read_metrics(out)


DAMAGE = {
    "missing": lambda path: path.unlink(),
    "empty": lambda path: path.write_text(""),  # as a kill while it was rewritten in place
    "torn": lambda path: path.write_bytes(path.read_bytes()[:100]),
    # a kill between the checkpoint and the file: its last row not written yet
    "behind": lambda path: path.write_bytes(b"".join(path.read_bytes().splitlines(True)[:2])),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_metrics_file_is_written_again_from_the_checkpoint(
    project, two_epochs, tmp_path, damage
):
    before = read_metrics(two_epochs[0])
    rows = resumed(project, two_epochs, tmp_path, damage)
    assert rows[:2] == before  # the same numbers, to the last digit
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert not (tmp_path / "out/metrics.csv.bak").exists()  # what the run lost, not an edit


def test_a_finished_run_started_again_puts_back_its_metrics_file(
    project, two_epochs, tmp_path, capsys
):
    """The same command after the last epoch trains nothing, and still writes metrics.csv
    again, to the byte, when it has gone missing."""
    out = tmp_path / "out"
    shutil.copytree(two_epochs[0], out)
    (out / "metrics.csv").unlink()
    train(project, *RUN, "--out-dir", str(out))
    assert "nothing to do: " in capsys.readouterr().out
    assert (out / "metrics.csv").read_text() == two_epochs[1]


def test_an_edited_metrics_file_is_kept_aside_and_written_again(
    project, two_epochs, tmp_path, capsys
):
    edited = two_epochs[1].replace("\n2,", "\n2,0.5,", 1)  # a value typed into row 2

    def edit(path):
        path.write_text(edited)

    rows = resumed(project, two_epochs, tmp_path, edit)
    assert rows[:2] == read_metrics(two_epochs[0])
    assert (tmp_path / "out/metrics.csv.bak").read_text() == edited
    path = tmp_path / "out/metrics.csv"
    assert f"{path} was not this run's history: kept as metrics.csv.bak" in capsys.readouterr().out


def test_a_row_past_the_checkpoint_is_this_runs_own(project, two_epochs, tmp_path, capsys):
    """An epoch's row is written before its checkpoint: a kill between the two leaves a row
    that the checkpoint has not. It is the run's own, not an edit: no copy is kept aside,
    and the epoch's row comes again when the epoch is trained again."""

    def one_row_more(path):
        written = path.read_bytes()  # rows end in \r\n, as the csv module writes them
        path.write_bytes(written + written.splitlines(keepends=True)[-1].replace(b"2,", b"3,", 1))

    rows = resumed(project, two_epochs, tmp_path, one_row_more)
    assert rows[:2] == read_metrics(two_epochs[0]) and [row["epoch"] for row in rows] == [1, 2, 3]
    assert not (tmp_path / "out/metrics.csv.bak").exists()
    assert "was not this run's history" not in capsys.readouterr().out


def older_release(out) -> None:
    """Make out/last.pt look as a release before the history was kept wrote it."""
    state = torch.load(out / "last.pt", weights_only=True)
    del state["progress"]["history"]
    torch.save(state, out / "last.pt")


def test_an_older_checkpoint_keeps_the_rows_of_metrics_csv(project, two_epochs, tmp_path):
    before = read_metrics(two_epochs[0])
    rows = resumed(project, two_epochs, tmp_path, lambda path: older_release(path.parent))
    assert rows[:2] == before and [row["epoch"] for row in rows] == [1, 2, 3]


@pytest.mark.parametrize(
    "text,reason",
    [
        ("epoch,train_loss\n1,0.5\ntwo,0.4\n", "ValueError: could not convert string to float"),
        ("train_loss\n0.5\n", "KeyError: 'epoch'"),
        (b"epoch\n\xff\xfe\n", "UnicodeDecodeError"),
    ],
    ids=["not a number", "no epoch", "not text"],
)
def test_an_unreadable_metrics_file_is_one_line_before_training(
    project, two_epochs, tmp_path, text, reason
):
    """With a checkpoint that keeps no history the file is the only record of the epochs
    before: one that cannot be read stops the run before it trains, naming the file."""
    out = tmp_path / "out"
    shutil.copytree(two_epochs[0], out)
    older_release(out)
    path = out / "metrics.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    checkpoint = (out / "last.pt").read_bytes()
    with pytest.raises(SystemExit) as stop:
        train(project, *RUN, "--epochs", "3", "--out-dir", str(out))
    message = str(stop.value.code)
    assert message.startswith(f"error: {path}: cannot read it ({reason}")
    assert message.endswith("move it away to go on without the rows of the epochs before")
    assert "\n" not in message
    assert (out / "last.pt").read_bytes() == checkpoint  # nothing trained, nothing saved
    assert path.read_bytes() == (text if isinstance(text, bytes) else text.encode())


def test_run_files_are_replaced_whole_after_reaching_the_disk(project, tmp_path, monkeypatch):
    """A power cut or kill -9 must find each of metrics.csv, last.pt and best.pt whole: each
    is written to a temporary file beside it, which is flushed to the disk (fsync) before it
    takes the file's place (rename), and the folder is flushed after; none is ever opened
    for writing in place."""
    import builtins
    import io

    out = tmp_path / "out"
    names = ("metrics.csv", "last.pt", "best.pt")
    events = []
    real_fsync, real_replace, real_open = os.fsync, os.replace, builtins.open

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        return real_replace(src, dst)

    def opened(file, mode="r", *args, **kwargs):
        if str(file).endswith(names) and any(c in mode for c in "wax+"):
            events.append(("in place", str(file)))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(builtins, "open", opened)
    monkeypatch.setattr(io, "open", opened)  # what Path.open calls
    train(project, *RUN, "--out-dir", str(out))
    assert not [e for e in events if e[0] == "in place"], events
    written = [e for e in events if e[0] == "replace"]
    assert sorted({os.path.basename(e[2]) for e in written}) == sorted(names)
    for _, src, dst in written:
        i = events.index(("replace", src, dst))
        assert os.path.dirname(src) == str(out) and os.path.basename(src).startswith(".")
        assert ("fsync", src) in events[:i], f"{dst} replaced by a file not flushed first"
        assert events[i + 1] == ("fsync", str(out)), f"{dst}: the folder was not flushed"


def test_outputs_take_the_mode_the_umask_gives(two_epochs):
    """Checkpoints and metrics.csv, written through temporary files, are readable as files
    that open() makes are (0644 under the usual umask 022), not the temporary files' 0600."""
    umask = os.umask(0)
    os.umask(umask)
    for name in ("last.pt", "best.pt", "metrics.csv"):
        assert (two_epochs[0] / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_named_terms_may_be_plain_numbers(project):
    """compute_loss's terms may be tensors or plain numbers (a weight, a count): each epoch
    logs their means alike."""
    with inside(project):
        from proj.metrics import TrainMetrics

    metrics = TrainMetrics(torch.device("cpu"))
    for loss, term in ((1.0, 3.0), (2.0, 5.0)):
        metrics.add(torch.tensor(loss), {"term": torch.tensor(term), "weight": 0.5, "count": 2})
    assert metrics.means() == {
        "train_loss": 1.5, "train_term": 4.0, "train_weight": 0.5, "train_count": 2.0
    }  # fmt: skip


def test_terms_that_change_within_an_epoch_are_one_line(project):
    """A term named on some batches only would make its epoch mean a guess (and, under DDP,
    processes with other terms would wait on each other for ever): refused in one line. The
    terms may change between epochs, and at a resumed epoch's start."""
    with inside(project):
        from proj.metrics import TrainMetrics
        from proj.utils import UserError

    metrics = TrainMetrics(torch.device("cpu"))
    metrics.add(torch.tensor(1.0), {"pos": torch.tensor(2.0)})
    metrics.add(torch.tensor(3.0), {"pos": torch.tensor(4.0)})
    for terms in ({}, {"neg": torch.tensor(0.0)}, {"pos": 1.0, "neg": 0.0}):
        with pytest.raises(UserError) as refused:
            metrics.add(torch.tensor(5.0), terms)
        assert str(refused.value) == (
            f"compute_loss named the terms {list(terms)} after ['pos'] in the same epoch: name "
            "the same on every batch (0 where one does not apply)"
        )
    assert metrics.means() == {"train_loss": 2.0, "train_pos": 3.0}  # nothing lost
    metrics.start_epoch()
    metrics.add(torch.tensor(1.0), {})
    assert metrics.means() == {"train_loss": 1.0}
    saved = metrics.state_dict()
    for state, accepted in (
        (saved, False),
        ({**saved, "totals": torch.zeros(2), "pending": []}, True),
    ):
        resumed = TrainMetrics(torch.device("cpu"))
        resumed.load_state_dict(state)
        if accepted:  # an epoch's end
            resumed.add(torch.tensor(1.0), {"new": 1.0})
        else:
            with pytest.raises(UserError):
                resumed.add(torch.tensor(1.0), {"new": 1.0})


def test_losses_not_yet_summed_are_saved_and_an_epoch_without_a_finite_one_is_nan(project):
    """A checkpoint between host syncs holds the micro-batches' losses not yet summed: the
    resumed epoch's means count them. An epoch whose losses were all NaN has a NaN mean."""
    with inside(project):
        from proj.metrics import TrainMetrics

    metrics = TrainMetrics(torch.device("cpu"))
    metrics.add(torch.tensor(1.0), {})
    metrics.fold()
    for loss in (2.0, 6.0):  # pending: no host sync since
        metrics.add(torch.tensor(loss), {})
    resumed = TrainMetrics(torch.device("cpu"))
    resumed.load_state_dict(metrics.state_dict())
    assert resumed.means() == {"train_loss": 3.0}
    nothing = TrainMetrics(torch.device("cpu"))
    nothing.add(torch.tensor(math.nan), {})
    assert math.isnan(nothing.means()["train_loss"])


def test_rows_past_the_history_one_is_the_runs_own_two_are_not(project, tmp_path, capsys):
    """Releases before v0.18.0 wrote an epoch's row before its checkpoint: one row past the
    checkpoint's history is the run's own; two are another run's, kept aside."""
    with inside(project):
        from proj.logger import MetricsLogger

    history = [{"epoch": 1, "train_loss": 0.5}, {"epoch": 2, "train_loss": 0.25}]
    ours = b"epoch,train_loss\r\n1,0.5\r\n2,0.25\r\n"
    for past, kept in ((1, False), (2, True)):
        out = tmp_path / f"past-{past}"
        out.mkdir()
        rows = "".join(f"{3 + i},0.125\r\n" for i in range(past)).encode()
        (out / "metrics.csv").write_bytes(ours + rows)
        MetricsLogger(out, list(history), epoch=2)
        assert (out / "metrics.csv").read_bytes() == ours
        assert (out / "metrics.csv.bak").exists() == kept, past


def test_an_older_metrics_file_with_empty_cells_is_read(project, tmp_path):
    """An older release's rows, where a column came later (empty before): read as numbers,
    the empty cells left out."""
    with inside(project):
        from proj.logger import read_rows

    path = tmp_path / "metrics.csv"
    path.write_text("epoch,train_loss,val_acc\n1,0.5,\n2,0.25,80\n3,0.125,90\n")
    assert read_rows(path, epoch=2) == [
        {"epoch": 1, "train_loss": 0.5},
        {"epoch": 2, "train_loss": 0.25, "val_acc": 80.0},
    ]
