"""Bad input gets one clear line and loses nothing: flags, checkpoints, non-finite losses,
and checkpoint writers killed at random moments."""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import unittest.mock

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from tests.helpers import TINY_RUN, inside, read_metrics, render, run, script_exit, train
from tests.test_matrix import check_tensorboard
from tests.test_resume import same_training

PY = sys.executable


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("robust") / "p")


BAD_FLAGS = {
    "epochs 0": (["--epochs", "0"], "argument --epochs: must be an integer >= 1, got '0'"),
    "negative lr": (["--lr", "-1"], "argument --lr: must be a number > 0"),
    "lr not a number": (["--lr", "fast"], "argument --lr: must be a number > 0"),
    "negative workers": (["--workers", "-2"], "argument --workers: must be an integer >= 0"),
    "batch size 0": (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1"),
    "unknown data set": (["--data", "imagenet22k"], "argument --data: invalid choice"),
    "unknown model": (
        ["--model", "resnet9000"],
        "argument --model: unknown model 'resnet9000': use resnet_small, mlp or a torchvision "
        "classifier; add your own to MODELS in models.py",
    ),
    "missing checkpoint": (["--resume", "nowhere.pt"], "argument --resume: nowhere.pt is not"),
    "unknown device": (["--device", "tpu7"], "argument --device: unknown device 'tpu7'"),
    "label smoothing 1": (["--label-smoothing", "1"], "argument --label-smoothing: must be"),
    "unknown flag": (["--learning-rate", "0.1"], "unrecognized arguments: --learning-rate"),
    "seed past 32 bits": (
        ["--seed", str(2**32)],
        "argument --seed: must be an integer >= 0 and <= 4294967295, got '4294967296'",
    ),
    "lr infinite": (["--lr", "inf"], "argument --lr: must be a finite number > 0"),
    "lr nan": (["--lr", "nan"], "argument --lr: must be a finite number > 0"),
    "weight decay infinite": (
        ["--weight-decay", "inf"],
        "argument --weight-decay: must be a finite",
    ),
    "warmup infinite": (["--warmup-epochs", "inf"], "argument --warmup-epochs: must be a finite"),
    "clipping -inf": (["--clip-grad=-inf"], "argument --clip-grad: must be a finite number"),
    "lr past float32": (
        ["--lr", "1e300"],
        "argument --lr: must be a finite number > 0",
    ),
    "label smoothing nan": (["--label-smoothing", "nan"], "argument --label-smoothing: must be a"),
    "eval-only with fresh": (
        ["--eval-only", "--fresh"],
        "argument --eval-only: --fresh leaves nothing to evaluate; give --init-weights",
    ),
    "resume and init-weights": (
        ["--resume", "train.py", "--init-weights", "train.py"],
        "argument --init-weights: not allowed with --resume: give the weights to start from, "
        "or the checkpoint of the run to go on with",
    ),
    "eval-only without a checkpoint": (
        ["--eval-only", "--out-dir", "runs/never-trained"],
        "argument --eval-only: no checkpoint to evaluate: give --resume or --init-weights",
    ),
    "out-dir a file": (["--out-dir", "train.py"], "argument --out-dir: cannot write to train.py"),
    "out-dir inside a file": (
        ["--out-dir", "train.py/runs"],
        "argument --out-dir: cannot write to train.py/runs (Not a directory)",
    ),
    "image size of cifar": (
        ["--data", "cifar10", "--image-size", "64"],
        "argument --image-size: cifar10 images are 32x32",
    ),
}


def refused_before_any_data(project, flags) -> tuple[int, str]:
    """train.main(flags) with data loading forbidden: (its exit status, the parser's prog)."""
    with inside(project):
        import train

        def no_data(args):
            raise AssertionError("data was loaded before the flags were checked")

        train.build_dataset = no_data
        with pytest.raises(SystemExit) as exit_info:
            train.main(flags)
        return exit_info.value.code, train.get_args_parser().prog


@pytest.mark.parametrize("flags,message", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_bad_flag_is_one_line_before_any_data_is_loaded(project, capsys, flags, message):
    code, _ = refused_before_any_data(project, flags)
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("below", ["", "run/1"], ids=["the-link", "a-folder-below-it"])
def test_an_out_dir_linking_to_a_removed_folder_is_one_line_naming_it(
    project, tmp_path, capsys, below
):
    link, scratch = tmp_path / "runs", tmp_path / "scratch"
    scratch.mkdir()
    link.symlink_to(scratch)
    scratch.rmdir()  # a scratch space cleaned since
    out_dir = link / below if below else link
    code, _ = refused_before_any_data(project, ["--out-dir", str(out_dir)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    message = (
        f"argument --out-dir: cannot write to {out_dir} ({link} links to {scratch}, which "
        "does not exist)"
    )
    assert len(err) == 1 and err[0].endswith(message), err


def test_a_resume_with_other_parameters_frozen_is_one_line(project, tmp_path):
    """The optimizer's state holds the parameters that trained: a layer thawed since (or
    frozen) leaves it for other ones. Refused in one line, with the way to go on."""
    frozen = [True]

    def half_frozen(info):
        model = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(192, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)
        )
        model[1].requires_grad_(not frozen[0])
        return model

    flags = [*TINY_RUN, "--image-size", "8", "--model", "half_frozen", "--out-dir", str(tmp_path)]
    with inside(project):
        from proj import models

        models.MODELS["half_frozen"] = half_frozen
        sys.argv = ["train.py", *flags, "--epochs", "1"]
        runpy.run_path("train.py", run_name="__main__")
        frozen[0] = False
        sys.argv = ["train.py", *flags, "--epochs", "2"]
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path("train.py", run_name="__main__")
    assert exit_info.value.code == (
        f"error: {tmp_path}/last.pt: its optimizer state is for other trainable parameters "
        "(loaded state dict contains a parameter group that doesn't match the size of "
        f"optimizer's group): start from its weights with --init-weights {tmp_path}/last.pt "
        "--fresh"
    )


def test_eval_only_evaluates_exactly_the_weights_it_names(project, tmp_path, capsys):
    """Two runs whose weights differ; --eval-only in the first run's --out-dir reports the
    metrics that the named run logged for its last epoch, and names that checkpoint."""
    a, b = tmp_path / "a", tmp_path / "b"
    logged = {
        a: train(project, *TINY_RUN, "--model", "mlp", "--epochs", "1", "--out-dir", str(a)),
        b: train(project, *TINY_RUN, "--model", "mlp", "--seed", "1", "--out-dir", str(b)),
    }
    logged = {run: read_metrics(run)[-1] for run in logged}
    assert logged[a]["val_loss"] != logged[b]["val_loss"]
    cases = {
        (): a,
        ("--init-weights", b / "last.pt"): b,
        ("--resume", b / "last.pt"): b,
        ("--fresh", "--init-weights", b / "best.pt"): b,
    }
    for flags, weights in cases.items():
        capsys.readouterr()
        with inside(project):
            import train as script

            script.main(
                [*TINY_RUN, "--model", "mlp", "--eval-only", "--out-dir", str(a), *map(str, flags)]
            )
        line = capsys.readouterr().out.strip().splitlines()[-1]
        named = flags[-1] if flags else a / "last.pt"
        assert line.endswith(f"  ({named})"), (flags, line)
        loss, acc = map(float, line.split()[1:4:2])
        assert loss == pytest.approx(logged[weights]["val_loss"], abs=1e-6), flags
        assert acc == pytest.approx(logged[weights]["val_acc"], abs=1e-6), flags


# Flags that contradict each other, the project or the float32 arithmetic: refused before
# any data is loaded, in exactly this line.
CONTRADICTIONS = {
    "fresh with resume": (
        ["--fresh", "--resume", "train.py"],
        "argument --fresh: not allowed with --resume (one starts over, the other goes on)",
    ),
    "find-lr with resume": (
        ["--find-lr", "--resume", "train.py"],
        "argument --find-lr: not allowed with --resume: the sweep starts from new weights",
    ),
    "out-dir empty": (["--out-dir", ""], "argument --out-dir: must name a folder, got ''"),
    "out-dir blank": (["--out-dir", "  "], "argument --out-dir: must name a folder, got '  '"),
    "out-dir the project": (
        ["--out-dir", "."],
        "argument --out-dir: . holds train.py: give runs a folder of their own",
    ),
    "data-dir empty": (["--data-dir", ""], "argument --data-dir: must name a folder, got ''"),
    "lr 0 as a float32": (
        ["--lr", "1e-50"],
        "argument --lr: must be a number > 0 or auto, got '1e-50', which is 0 as a float32",
    ),
    "sweep start 0 as a float32": (
        ["--find-lr-start", "1e-46"],
        "argument --find-lr-start: must be a number > 0, got '1e-46', which is 0 as a float32",
    ),
    "min-lr above lr": (
        ["--lr", "0.1", "--min-lr", "2.5"],
        "argument --min-lr: must be at most --lr (0.1), got 2.5",
    ),
    "warmup longer than the run": (
        ["--epochs", "2", "--warmup-epochs", "3"],
        "argument --warmup-epochs: 3 is longer than the 2-epoch schedule: the lr would never "
        "reach --lr",
    ),
}
DEVICES = ": use auto, cpu, cuda, cuda:N (N counts from 0) or mps"
for name in ("gpu", "cuda:x", "cuda:-1", "cpu:0", "CUDA", "cuda:"):
    CONTRADICTIONS[f"device {name}"] = (
        ["--device", name],
        f"argument --device: unknown device {name!r}{DEVICES}",
    )


@pytest.mark.parametrize("flags,message", CONTRADICTIONS.values(), ids=CONTRADICTIONS.keys())
def test_contradictory_flags_are_one_line_before_any_data_is_loaded(
    project, capsys, flags, message
):
    code, prog = refused_before_any_data(project, flags)
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [f"{prog}: error: {message}"]


def test_just_inside_the_contradictions_is_accepted(project):
    """The edges of the checks above: a floor at the peak, a warmup as long as the run, a
    tiny lr that a float32 still holds, an --out-dir beside the project's files."""
    with inside(project):
        import train

        parse = train.get_args_parser().parse_args
        args = parse(["--lr", "0.1", "--min-lr", "0.1", "--epochs", "1", "--warmup-epochs", "1"])
        assert (args.min_lr, args.warmup_epochs) == (0.1, 1.0)
        assert parse(["--lr", "1e-44"]).lr == 1e-44
        # Closed bounds take their ends, also one that a float32 holds only approximately
        # (0.999 is 0.99900001 as a float32: compared in float32, it is the bound itself).
        args = parse(["--hflip", "1", "--momentum", "1"])
        assert (args.hflip, args.momentum) == (1.0, 1.0)
        assert parse(["--out-dir", "proj/../runs/x", "--fresh", "--init-weights", "train.py"])
        from proj.utils import float_in

        assert float_in(0, 0.999)("0.999") == 0.999


@pytest.mark.parametrize(
    ("cuda_devices", "device", "message"),
    [
        (0, "cuda", "CUDA is not available on this machine"),
        (0, "cuda:1", "CUDA is not available on this machine"),
        (1, "cuda:1", "no device cuda:1: this machine has 1 CUDA device, cuda:0"),
        (2, "cuda:99", "no device cuda:99: this machine has 2 CUDA devices, cuda:0 to cuda:1"),
        (2, "mps", "MPS (Apple's GPUs) is not available on this machine"),
        (2, "cuda:1", None),
        (2, "cuda", None),
    ],
)
def test_devices_the_machine_lacks_are_one_line(
    project, monkeypatch, capsys, cuda_devices, device, message
):
    """As machines with 0, 1 or 2 GPUs and no MPS see --device (here as the flag is parsed:
    nothing touches a device)."""
    # Cached functions, as torch's own (torch._dynamo looks for their __wrapped__).
    monkeypatch.setattr(torch.cuda, "is_available", functools.cache(lambda: cuda_devices > 0))
    monkeypatch.setattr(torch.cuda, "device_count", functools.cache(lambda: cuda_devices))
    monkeypatch.setattr(torch.backends.mps, "is_available", functools.cache(lambda: False))
    with inside(project):
        import train

        parser = train.get_args_parser()
        if message is None:
            assert parser.parse_args(["--device", device]).device == device
            return
        with pytest.raises(SystemExit):
            parser.parse_args(["--device", device])
    assert capsys.readouterr().err.splitlines() == [
        f"{parser.prog}: error: argument --device: {message}"
    ]


def test_missing_image_folder_is_one_line(project, tmp_path):
    result = run(
        PY,
        "train.py",
        "--data",
        "imagefolder",
        "--data-dir",
        tmp_path / "none",
        cwd=project,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'none'}/train is not a folder: --data imagefolder wants "
        f"{tmp_path / 'none'}/train and {tmp_path / 'none'}/val, each with one sub-folder of "
        "images per class"
    ]


@pytest.fixture(scope="module")
def checkpoint(project, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    run(PY, "train.py", *TINY_RUN, "--epochs", "1", "--out-dir", out, cwd=project)
    return out / "last.pt"


def bad_checkpoints(checkpoint, folder):
    data = checkpoint.read_bytes()
    (folder / "truncated.pt").write_bytes(data[: len(data) // 2])
    (folder / "empty.pt").write_bytes(b"")
    (folder / "text.pt").write_text("this is not a checkpoint\n")
    torch.save({"weights": torch.zeros(3)}, folder / "foreign.pt")
    # A checkpoint that would build an object while loading: refused, never unpickled.
    state = torch.load(checkpoint, weights_only=True)
    state["args"] = argparse.Namespace(**state["args"])
    torch.save(state, folder / "with-code.pt")
    return {
        "with-code.pt": "not a readable checkpoint",
        "truncated.pt": "not a readable checkpoint",
        "empty.pt": "not a readable checkpoint",
        "text.pt": "not a readable checkpoint",
        "foreign.pt": "not a checkpoint of this project",
    }


def test_bad_checkpoints_get_one_line_naming_the_file(project, checkpoint, tmp_path):
    """train.py run as a script (in this process: the same `__main__` block) exits with one
    line naming the file, and writes nothing else to stderr: no traceback."""
    cases = bad_checkpoints(checkpoint, tmp_path)
    cases = {tmp_path / name: problem for name, problem in cases.items()}
    # Weights alone (another project's, or python -m <package>.sharding's): not a run.
    torch.save({"model": torch.load(checkpoint, weights_only=True)["model"]}, tmp_path / "w.pt")
    weights = tmp_path / "w.pt"
    cases[weights] = f"model weights alone, not a run to resume: --init-weights {weights} --fresh"
    # A checkpoint of another model.
    cases[checkpoint] = "weights do not fit --model mlp"
    for path, problem in cases.items():
        model = ["--model", "mlp"] if path == checkpoint else []
        flags = [*TINY_RUN, *model, "--resume", path, "--out-dir", tmp_path / "o"]
        code, stderr = script_exit(project, *flags)
        assert isinstance(code, str) and stderr == "", (path, code, stderr)
        assert len(code.splitlines()) == 1 and code.startswith(f"error: {path}: {problem}"), code
    made = torch.load(checkpoint, weights_only=True)["args"]["model"]  # the last case's
    assert made != "mlp" and code.endswith(f"; they are of --model {made})"), code


def resume(project, checkpoint, out, *flags: str) -> None:
    """train.py's main in this process: TINY_RUN (2 epochs) from `checkpoint`, into `out`."""
    with inside(project):
        import train

        train.main([*TINY_RUN, "--resume", str(checkpoint), "--out-dir", str(out), *flags])


NEW_SCHEDULE = "a new schedule (--more-epochs restart) or "
# Flags that a checkpoint holds the values of (the optimizer's and the schedule's state, the
# random state): a resume that gives others is refused, naming each with both values.
CHANGED_ON_RESUME = {
    "lr": (["--lr", "0.1"], "--lr 0.2 (given 0.1); to change it, start " + NEW_SCHEDULE),
    "seed": (["--seed", "7"], "--seed 0 (given 7); to change it, start "),
    "optimizer flags": (
        ["--weight-decay", "0.01", "--momentum", "0.5"],
        "--weight-decay 0.0005 (given 0.01), --momentum 0.9 (given 0.5); to change them, "
        "start " + NEW_SCHEDULE,
    ),
    "schedule flags": (
        ["--warmup-epochs", "0.5", "--min-lr", "0.001"],
        "--warmup-epochs None (given 0.5), --min-lr None (given 0.001); to change them, start "
        + NEW_SCHEDULE,
    ),
    "seed with a new schedule": (
        ["--seed", "7", "--lr", "0.1", "--epochs", "3", "--more-epochs", "restart"],
        "--seed 0 (given 7); to change it, start ",
    ),
}


@pytest.mark.parametrize("flags,kept", CHANGED_ON_RESUME.values(), ids=CHANGED_ON_RESUME.keys())
def test_flags_a_resume_cannot_take_are_refused_naming_them(
    project, checkpoint, tmp_path, flags, kept
):
    with pytest.raises(Exception) as refused:
        resume(project, checkpoint, tmp_path / "out", *flags)
    assert type(refused.value).__name__ == "CheckpointError"
    assert str(refused.value) == (
        f"{checkpoint}: resuming goes on with the checkpoint's {kept}from its weights with "
        f"--init-weights {checkpoint} --fresh"
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".lock"]


def test_a_resume_that_leaves_out_flags_the_checkpoint_holds_goes_on_with_them(project, tmp_path):
    """--lr, an optimizer flag and --seed that a command leaves out take the checkpoint's
    values, as if it gave them (a default is not a value given: no refusal); a new schedule
    takes their defaults, but the seed."""
    held = ["--lr", "0.05", "--momentum", "0.8", "--seed", "3"]
    first = tmp_path / "first"
    run(PY, "train.py", *TINY_RUN, *held, "--epochs", "1", "--out-dir", first, cwd=project)
    resume(project, first / "last.pt", tmp_path / "given", *held)
    resume(project, first / "last.pt", tmp_path / "left-out")
    same_training(tmp_path / "given/last.pt", tmp_path / "left-out/last.pt")
    saved = torch.load(tmp_path / "left-out/last.pt", weights_only=True)["args"]
    assert (saved["lr"], saved["momentum"], saved["seed"]) == (0.05, 0.8, 3)
    # A new schedule takes the defaults of what it leaves out, but the seed.
    resume(
        project, first / "last.pt", tmp_path / "new", "--epochs", "3", "--more-epochs", "restart"
    )
    saved = torch.load(tmp_path / "new/last.pt", weights_only=True)["args"]
    assert (saved["lr"], saved["momentum"], saved["seed"]) == (0.2, 0.9, 3)


def test_a_new_schedule_takes_new_optimizer_flags(project, checkpoint, tmp_path):
    """--more-epochs restart builds the schedule and the optimizer's settings anew: a resume
    that starts one takes a new --lr and --momentum."""
    flags = ["--lr", "0.1", "--momentum", "0.5", "--epochs", "3", "--more-epochs", "restart"]
    # Into another --out-dir: the metrics history comes with the checkpoint.
    resume(project, checkpoint, tmp_path, *flags)
    assert [row["epoch"] for row in read_metrics(tmp_path)] == [1, 2, 3]
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (state["args"]["lr"], state["args"]["momentum"]) == (0.1, 0.5)
    group = state["optimizer"]["param_groups"][0]
    assert (group["initial_lr"], group["momentum"]) == (0.1, 0.5)


def test_a_part_way_checkpoint_of_ddp_processes_is_refused(project, checkpoint, tmp_path):
    """A checkpoint that 2 DDP processes saved in the middle of an epoch (each with its share
    of the epoch's order) is refused by a single process in one line; from the end of an
    epoch it resumes."""
    state = torch.load(checkpoint, weights_only=True)
    own = {"rng": state["rng"], "sums": state["sums"], "guard": state["guard"]}
    state["processes"] = [own, own]
    state["progress"].update(batch=2, step=state["progress"]["step"] + 2)
    torch.save(state, tmp_path / "ddp.pt")
    with pytest.raises(Exception) as refused:
        resume(project, tmp_path / "ddp.pt", tmp_path / "out")
    assert str(refused.value) == (
        f"{tmp_path / 'ddp.pt'}: saved part-way through epoch 2 by 2 processes, whose "
        "order one process cannot follow: finish that epoch with them, or start from its "
        f"weights with --init-weights {tmp_path / 'ddp.pt'} --fresh"
    )
    state["progress"].update(batch=0, step=state["progress"]["step"] - 2)
    torch.save(state, tmp_path / "ddp.pt")
    resume(project, tmp_path / "ddp.pt", tmp_path / "out")
    assert [row["epoch"] for row in read_metrics(tmp_path / "out")] == [1, 2]


def test_a_synthetic_set_too_large_for_the_memory_is_one_line(project, tmp_path, monkeypatch):
    """Checked before any of it is made, as on a machine with 1 GiB of memory: 16 images of
    1024 x 1024 would take about 1.2 GiB while they are made."""
    import os

    memory = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**18}
    monkeypatch.setattr(os, "sysconf", lambda name: memory[name])
    flags = ["--synthetic-size", "16", "--image-size", "1024", "--out-dir", str(tmp_path)]
    with inside(project), pytest.raises(Exception) as refused:
        import train

        train.main(flags)
    assert str(refused.value) == (
        "data set 'synthetic': making it takes about 1.2 GiB of memory, this machine has 1.0 "
        "GiB: lower --synthetic-size or --image-size"
    )
    assert type(refused.value).__name__ == "DataError"


def test_checkpoints_hold_only_what_weights_only_loads(project, checkpoint):
    """Plain data, and the run as it stood at the end of its epoch: 96 images in batches of
    16 are 6 steps, the epoch's sums and bad steps start again from 0, the flags as parsed
    (--amp as settled: off on a CPU), metrics.csv's rows."""
    state = torch.load(checkpoint, weights_only=True)  # raises on anything but plain data
    parts = ["model", "optimizer", "scheduler", "progress", "rng", "sums", "guard", "args"]
    assert sorted(state) == sorted([*parts, "format", "classes", "job"])
    assert state["job"] == os.environ.get("SLURM_JOB_ID")  # the job that wrote it: none here
    assert (state["format"], state["classes"]) == (2, ["SGD", "LambdaLR"])
    progress = state["progress"]
    assert (progress["epoch"], progress["batch"], progress["step"]) == (1, 0, 6)
    assert progress["history"] == read_metrics(checkpoint.parent)
    assert state["scheduler"]["last_epoch"] == 6
    assert state["sums"]["totals"].tolist() == [0.0, 0.0] and state["sums"]["pending"] == []
    assert state["guard"]["bad_steps"].item() == 0 and state["guard"]["pending"] == []
    with inside(project):
        import train

        flags = [*TINY_RUN, "--epochs", "1", "--out-dir", str(checkpoint.parent)]
        parsed = vars(train.get_args_parser().parse_args(flags))
    assert state["args"] == {**parsed, "amp": "off"}


def test_a_resumed_epoch_counts_the_bad_steps_saved_before(project, checkpoint, tmp_path):
    """The guard's count of the epoch's skipped steps, and the flags of steps not yet
    counted, come back from a checkpoint saved part-way through the epoch (here as if two
    steps into epoch 2, after a bad step and with another one waiting)."""
    state = torch.load(checkpoint, weights_only=True)
    state["progress"].update(batch=2, step=state["progress"]["step"] + 2)
    state["guard"] = {"bad_steps": torch.tensor(1.0), "pending": [torch.tensor(1.0)]}
    torch.save(state, tmp_path / "part-way.pt")
    resume(project, tmp_path / "part-way.pt", tmp_path / "out")
    assert [row["nonfinite_steps"] for row in read_metrics(tmp_path / "out")] == [0, 2]


@pytest.mark.parametrize(
    ("steps", "advice"),
    [(2, "So was the first, before any update: look for NaN"), (6, "Try a lower --lr")],
    ids=["bad-from-the-first", "bad-since-step-5"],
)
def test_a_streak_of_bad_steps_goes_on_across_a_resume(
    project, checkpoint, tmp_path, steps, advice
):
    """Saved after two bad steps in a row (of `steps` in all), the run resumed with bad
    losses stops at its first step, the third in a row; its advice knows whether every
    step so far was bad."""
    state = torch.load(checkpoint, weights_only=True)
    state["guard"].update(bad_in_row=torch.tensor(2.0), steps=steps)
    torch.save(state, tmp_path / "streak.pt")
    flags = ["--epochs", "3", "--max-bad-steps", "3", "--log-interval", "1"]
    with inside(project):
        import train

        real, calls = train.compute_loss, []

        def nan_loss(outputs, *rest):
            calls.append(1)
            return real(outputs, *rest) * math.nan

        train.compute_loss = nan_loss
        with pytest.raises(train.Stopped) as stopped:
            resume(project, tmp_path / "streak.pt", tmp_path / "out", *flags)
    assert len(calls) == 1
    assert str(stopped.value).startswith("3 optimizer steps in a row had a non-finite loss; ")
    assert advice in str(stopped.value)


@pytest.mark.parametrize("log_interval", ["2", "50"])  # 50: no host sync in an epoch of 6 steps
def test_non_finite_losses_stop_the_run_and_keep_the_last_good_checkpoint(
    project, tmp_path, log_interval
):
    out = tmp_path / "out"
    run(PY, "train.py", *TINY_RUN, "--epochs", "1", "--out-dir", out, cwd=project)
    good = (out / "last.pt").read_bytes()
    # An absurd learning rate overflows the loss after the first step.
    flags = [*TINY_RUN, "--fresh", "--lr", "1e30", "--log-interval", log_interval]
    flags += ["--max-bad-steps", "3"]
    result = run(PY, "train.py", *flags, "--out-dir", out, cwd=project, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    # Counted where the host syncs: steps 2 and 4 (the first is finite), or the epoch's end.
    in_row = {"2": 3, "50": 5}[log_interval]
    assert len(lines) == 1 and lines[0].endswith(
        f"{in_row} optimizer steps in a row had a non-finite loss; the last checkpoint in {out} "
        "is from "
        "before them. Try a lower --lr or --clip-grad, or look for NaN or inf in the data"
    ), lines
    assert (out / "last.pt").read_bytes() == good
    # No row of the stopped run, whose epoch ended (--log-interval 50) but saved nothing: the
    # earlier run's rows, not this one's (--fresh), were kept aside as it started.
    assert not (out / "metrics.csv").exists()
    assert [row["epoch"] for row in read_metrics(out, "metrics.csv.bak")] == [1]


def test_non_finite_losses_are_skipped_and_counted(project, tmp_path):
    """With no limit the run goes on; the skipped steps are counted, the weights stay finite."""
    flags = [*TINY_RUN, "--epochs", "1", "--lr", "1e30", "--max-bad-steps", "0"]
    run(PY, "train.py", *flags, "--out-dir", tmp_path, cwd=project)
    with (tmp_path / "metrics.csv").open() as f:
        header, row = f.read().splitlines()
    metrics = dict(zip(header.split(","), row.split(","), strict=True))
    assert int(metrics["nonfinite_steps"]) == 96 // 16 - 1  # every optimizer step but the first
    # The mean over the one finite loss, that of the untrained model (ln 10 = 2.30 for 10
    # classes), not its share of every image seen.
    assert 1.5 < float(metrics["train_loss"]) < 4
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    for name, tensor in state["model"].items():
        assert torch.isfinite(tensor.float()).all(), name


@pytest.mark.parametrize("optimizer", ["sgd", "nadam"])
def test_fp16_skipped_steps_leave_batchnorm_statistics_finite(template, tmp_path, optimizer):
    """Under fp16 loss scaling the GradScaler skips the overflowing steps; the guard still puts
    back the BatchNorm statistics that the overflowing forward passes wrote NaN into. Fused
    SGD and unfused NAdam, as the scaler steps them differently."""
    project = render(template, tmp_path / "p", amp="fp16", optimizer=optimizer)
    flags = [*TINY_RUN, "--epochs", "1", "--amp", "fp16", "--lr", "1e30", "--max-bad-steps", "0"]
    run(PY, "train.py", *flags, "--out-dir", tmp_path / "out", cwd=project)
    with (tmp_path / "out" / "metrics.csv").open() as f:
        header, row = f.read().splitlines()
    assert int(dict(zip(header.split(","), row.split(","), strict=True))["nonfinite_steps"]) > 0
    state = torch.load(tmp_path / "out" / "last.pt", weights_only=True)
    assert any("running_var" in name for name in state["model"])
    for name, tensor in state["model"].items():
        assert torch.isfinite(tensor.float()).all(), name


@pytest.mark.parametrize("nan_at", [1, 2])
def test_one_bad_micro_batch_skips_its_whole_window(project, tmp_path, nan_at):
    """With --accum-steps 2, a NaN loss in the first or the second micro-batch of the first
    window skips that window's step alone: one step counted, the weights stay finite. That
    is also the optimizer's first step, which fused SGD must be able to skip before it has
    momentum buffers."""
    wrapper = tmp_path / "wrap.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        "import torch.nn.functional as F\n"
        "sys.path.insert(0, os.getcwd())\n"
        "real, calls = F.cross_entropy, []\n"
        "def flaky(*args, **kwargs):\n"
        "    calls.append(1)\n"
        "    loss = real(*args, **kwargs)\n"
        f"    return loss * float('nan') if len(calls) == {nan_at} else loss\n"
        "F.cross_entropy = flaky\n"
        "runpy.run_path('train.py', run_name='__main__')\n"
    )
    flags = [*TINY_RUN, "--epochs", "1", "--accum-steps", "2", "--max-bad-steps", "0"]
    run(PY, wrapper, *flags, "--out-dir", tmp_path / "o", cwd=project)
    with (tmp_path / "o" / "metrics.csv").open() as f:
        header, row = f.read().splitlines()
    assert dict(zip(header.split(","), row.split(","), strict=True))["nonfinite_steps"] == "1"
    state = torch.load(tmp_path / "o" / "last.pt", weights_only=True)
    for name, tensor in state["model"].items():
        assert torch.isfinite(tensor.float()).all(), name


WRITER = """
import io, os, sys, time, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from proj.checkpoint import save_checkpoint

path, where = Path(sys.argv[2]), sys.argv[3]


def checkpoint(i):
    return {"model": {"w": torch.full((1_000_000,), float(i))}, "i": i}


def hold(*args):
    print("held", flush=True)
    time.sleep(300)


def part_written(state, f):
    whole = io.BytesIO()
    real_save(state, whole)
    f.write(whole.getvalue()[: int(float(where) * len(whole.getvalue()))])
    f.flush()
    hold()


def renamed(source, target):
    real_replace(source, target)
    hold()


save_checkpoint(checkpoint(1), path)
real_save, real_replace = torch.save, os.replace
if where == "fsync":
    os.fsync = hold
elif where == "rename":
    os.replace = renamed
else:
    torch.save = part_written
save_checkpoint(checkpoint(2), path)
"""
# Where a writer is held and killed while it writes checkpoint 2 over checkpoint 1: part-way
# through the bytes (none of them, half, all but the last), before they are flushed to the
# disk, after the rename (the folder not yet flushed); and which checkpoint the file must be.
KILLED_AT = {"0": 1, "0.5": 1, "0.9999": 1, "fsync": 1, "rename": 2}


def test_kill_9_during_checkpoint_writes_leaves_a_loadable_one(project, tmp_path):
    """Writers killed at known moments of a write (held there, never on timing luck): the
    file left is always the old checkpoint or the new one, whole."""
    from importlib import import_module

    path = tmp_path / "last.pt"
    with inside(project):
        load_checkpoint = import_module("proj.checkpoint").load_checkpoint
        for where, expected in KILLED_AT.items():
            writer = subprocess.Popen(
                [PY, "-c", WRITER, str(project), str(path), where],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert writer.stdout.readline() == "held\n", where
            finally:
                writer.send_signal(signal.SIGKILL)
                writer.wait()
            state = load_checkpoint(path)
            value = state["model"]["w"]
            assert state["i"] == expected and torch.all(value == expected), where
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "last.pt"]
    assert leftovers and all(name.startswith(".last.pt.") for name in leftovers)  # temporary
    # The next run's start clears them away: only the checkpoint and the run's lock stay.
    with inside(project):
        assert import_module("proj.utils").hold_out_dir(tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "last.pt"]


def test_a_file_system_without_locks_runs_unguarded_and_says_so(project, tmp_path, capsys):
    """A lock that the file system cannot take (ENOLCK: NFS mounted nolock) is not another
    run's: the run goes on, with a note; a lock another process holds is refused."""
    import errno
    import fcntl
    from importlib import import_module

    with inside(project):
        utils = import_module("proj.utils")
        for code, expected in ((errno.ENOLCK, None), (errno.EAGAIN, "another run is using")):

            def lockf(*args, code=code):
                raise OSError(code, os.strerror(code))

            with unittest.mock.patch.object(fcntl, "lockf", lockf):
                problem = utils.hold_out_dir(tmp_path / str(code))
            assert problem == expected or problem.startswith(expected), problem
    said = capsys.readouterr().out
    note = f"note: {tmp_path / str(errno.ENOLCK)} cannot be locked (No locks available): "
    assert said == note + "one run at a time there\n"


SLOW_SAVES = """
import runpy, sys, time
sys.path.insert(0, ".")
import proj.checkpoint

def save_checkpoint(state, path, save=proj.checkpoint.save_checkpoint):
    time.sleep(0.25)
    save(state, path)

proj.checkpoint.save_checkpoint = save_checkpoint
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_epoch_lines_reach_a_pipe_as_printed_and_after_their_checkpoint(project, tmp_path):
    """Output to a pipe or a file is written a line at a time, and an epoch's line comes after
    its checkpoint: when the reader sees epoch 1's line, last.pt holds epoch 1 (not yet 2).
    Each save waits a quarter of a second first, so that neither order is luck. Output
    in ASCII alone (PYTHONIOENCODING=ascii) escapes the other letters of a path; without
    docstrings (python -OO) the flags still parse."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONIOENCODING"] = "ascii"
    out = tmp_path / "\u00f6"
    flags = [*TINY_RUN, "--epochs", "2", "--out-dir", str(out)]
    with subprocess.Popen(
        [PY, "-c", SLOW_SAVES, *flags], cwd=project, env=env, stdout=subprocess.PIPE, text=True
    ) as child:
        line = next(line for line in child.stdout if line.startswith("epoch 1/2"))
        epoch = torch.load(out / "last.pt", weights_only=True)["progress"]["epoch"]
        child.stdout.read()
    assert child.returncode == 0 and epoch == 1, line
    again = run(PY, "-OO", "train.py", *flags, cwd=project, env=env).stdout
    assert again.splitlines()[-1] == f"nothing to do: {tmp_path}/\\xf6/last.pt is at epoch 2 of 2"


@pytest.mark.parametrize("optimizer", ["sgd", "nadam"])
def test_a_non_finite_step_leaves_model_and_optimizer_as_they_were(template, tmp_path, optimizer):
    """SGD's fused kernel skips the step itself (told through found_inf); NAdam has none, so
    its weights are put back from a copy. BatchNorm statistics are put back in both."""
    import copy

    import torch.nn.functional as F

    project = render(template, tmp_path / "p", optimizer=optimizer)
    with inside(project):
        import train
        from proj.data import DataInfo
        from proj.guard import NonFiniteGuard, non_finite
        from proj.models import build_model
        from proj.optim import build_optimizer

        values = torch.tensor([1.0, -3e38, 0.0, -0.0, float("inf"), float("-inf"), float("nan")])
        flags = [non_finite(v).item() for v in values]
        assert flags == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # the form fused kernels read
        assert non_finite(values[0]).dtype == torch.float32
        low = [non_finite(v).item() for v in values.bfloat16()]  # a loss made under autocast
        assert low == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
        assert non_finite(values.bfloat16()[0]).dtype == torch.float32

        torch.manual_seed(0)
        args = train.get_args_parser().parse_args([])
        model = build_model("resnet_small", DataInfo(10, (3, 8, 8)))
        optimizer_ = build_optimizer(model, args, torch.device("cpu"))
        if optimizer == "sgd":  # fused: its momentum buffers made now, as zeros, not by a
            # first step that, skipped, would leave the kernel's uninitialised memory in them
            buffers = [optimizer_.state[p].get("momentum_buffer") for p in model.parameters()]
            assert all(b is not None and not b.any() for b in buffers)
        guard = NonFiniteGuard(model, optimizer_)
        images, targets = torch.randn(16, 3, 8, 8), torch.randint(10, (16,))

        def step(scale: float) -> bool:
            guard.start_window()
            loss = F.cross_entropy(model(images * scale), targets)
            guard.add(loss.detach())  # as the training loop passes it
            loss.backward()
            guard.before_step()
            optimizer_.step()
            guard.after_step()
            optimizer_.zero_grad(set_to_none=True)
            return bool(guard.bad)

        assert not step(1.0)  # a good step first, so that the optimizer has state
        weights = copy.deepcopy(model.state_dict())
        state = copy.deepcopy(optimizer_.state_dict()["state"])
        assert step(float("inf"))  # inf x 0 in the images: NaN everywhere
        for name, tensor in model.state_dict().items():
            assert torch.equal(tensor, weights[name]), name
        if guard.in_kernel:  # the fused kernel did not touch its state either
            after = optimizer_.state_dict()["state"]
            for key, values in state.items():
                for name, value in values.items():
                    assert torch.equal(torch.as_tensor(after[key][name]), torch.as_tensor(value))
        assert guard.in_kernel == (optimizer == "sgd")  # the CPU has fused SGD
        assert not step(1.0)  # and training goes on
        assert any(not torch.equal(t, weights[n]) for n, t in model.state_dict().items())


@pytest.mark.parametrize("optimizer", ["sgd", "nadam"])
def test_weights_that_overflow_are_never_checkpointed(template, tmp_path, optimizer):
    """An update can overflow the weights even when its loss was finite, which the guard,
    looking at losses, lets through (here the 5th step puts inf into a weight, as an absurd
    learning rate would). The run stops in one line at its next checkpoint, which is not
    written: the one from step 4 stays."""
    project = render(template, tmp_path / "p", optimizer=optimizer, amp="off")
    out = tmp_path / "out"
    flags = [*TINY_RUN, "--save-every", "2", "--log-interval", "1", "--out-dir", str(out)]
    taken = []

    def overflow(opt, args, kwargs):
        taken.append(1)
        if len(taken) == 5:
            with torch.no_grad():
                next(p for group in opt.param_groups for p in group["params"]).fill_(math.inf)

    hook = register_optimizer_step_post_hook(overflow)
    try:
        with inside(project):
            import train

            with pytest.raises(train.Stopped) as stopped:
                train.main(flags)
    finally:
        hook.remove()
    assert stopped.value.exit_code == 1
    assert str(stopped.value) == (
        "the weights are no longer finite (NaN or inf) after step 6, so last.pt was not written; "
        f"the last checkpoint in {out} is from before. Try a lower --lr or --clip-grad, or look "
        "for NaN or inf in the data"
    )
    state = torch.load(out / "last.pt", weights_only=True)
    assert state["progress"]["step"] == 4
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


def test_an_epoch_whose_checkpoint_fails_still_prints_its_line(project, tmp_path, capsys):
    """The epoch's line comes after its checkpoints, and also when they fail: here the weights
    overflow in the epoch's last step, so its checkpoint is refused, and the line says how
    the epoch ended before the run stops."""

    def overflow(opt, args, kwargs):
        with torch.no_grad():
            next(p for group in opt.param_groups for p in group["params"]).fill_(math.inf)

    hook = None
    try:
        with inside(project):
            import train

            flags = [*TINY_RUN, "--model", "mlp", "--out-dir", str(tmp_path / "o")]
            real = train.train_step
            steps = []

            def counted(*args):  # the epoch's 6th and last step overflows
                steps.append(1)
                nonlocal hook
                if len(steps) == 6:
                    hook = register_optimizer_step_post_hook(overflow)
                return real(*args)

            train.train_step = counted
            with pytest.raises(train.Stopped) as stopped:
                train.main(flags)
    finally:
        if hook is not None:
            hook.remove()
    said = capsys.readouterr()
    assert "the weights are no longer finite (NaN or inf) after step 6" in str(stopped.value)
    assert re.search(r"^epoch 1/2  train_loss \S+  val_loss nan", said.out, re.M), said.out


HOLD_LOCK = """
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(120)
"""


TRY_LOCK = """
import fcntl, sys
try:
    fcntl.lockf(open(sys.argv[1], "a"), fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit("held")
"""


def test_a_run_holds_its_out_dir_for_as_long_as_it_runs(project, tmp_path):
    """hold_out_dir keeps its lock file open: another process cannot take the lock."""
    with inside(project):
        from proj.utils import hold_out_dir

        assert hold_out_dir(tmp_path) is None
        other = subprocess.run([PY, "-c", TRY_LOCK, str(tmp_path / ".lock")], capture_output=True)
    assert other.returncode == 1 and other.stderr == b"held\n"


def test_non_finite_buffers_count_as_weights_no_longer_finite(project):
    """A BatchNorm whose running variance overflowed is no model to save."""
    with inside(project):
        from proj.utils import all_finite

        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        assert all_finite(model)
        model[1].running_var[0] = math.inf
        assert not all_finite(model)


def test_a_second_run_into_the_same_out_dir_is_refused(project, tmp_path):
    """Two runs writing one --out-dir would mix their checkpoints and metrics.csv: while a
    run holds it (its .lock), another is refused in one line, touching nothing."""
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [PY, "-c", HOLD_LOCK, str(out / ".lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        result = run(PY, "train.py", *TINY_RUN, "--out-dir", out, cwd=project, check=False)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"train.py: error: argument --out-dir: another run is using {out}; wait or pick another"
    ]
    assert sorted(p.name for p in out.iterdir()) == [".lock"]
    # Once that run has ended, its lock is gone with it, and what a save killed half-way
    # left behind is cleared; the user's own files stay, whatever their names.
    (out / ".last.pt.0f3a9c4b7d2e.tmp").write_bytes(b"torn")
    for name in (".notes.tmp", ".draft.0123.tmp", "last.pt.0f3a9c4b7d2e.tmp"):
        (out / name).write_text("mine")
    run(PY, "train.py", *TINY_RUN, "--out-dir", out, cwd=project)
    assert sorted(p.name for p in out.iterdir()) == [
        ".draft.0123.tmp",
        ".lock",
        ".notes.tmp",
        "best.pt",
        "last.pt",
        "last.pt.0f3a9c4b7d2e.tmp",
        "metrics.csv",
    ]


def test_eval_only_runs_beside_the_run_that_holds_the_out_dir(project, checkpoint, tmp_path):
    """--eval-only writes nothing into --out-dir and so takes no lock: it evaluates a run's
    checkpoint while that run trains (here, while another process holds the lock), with the
    metrics of the same checkpoint evaluated anywhere else."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(checkpoint, out / "last.pt")
    elsewhere = run(PY, "train.py", *TINY_RUN, "--eval-only", "--resume", checkpoint, cwd=project)
    holder = subprocess.Popen(
        [PY, "-c", HOLD_LOCK, str(out / ".lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        beside = run(PY, "train.py", *TINY_RUN, "--eval-only", "--out-dir", out, cwd=project)
    finally:
        holder.kill()
        holder.wait()
    metrics = elsewhere.stdout.splitlines()[-1].replace(f"({checkpoint})", f"({out / 'last.pt'})")
    assert beside.stdout.splitlines()[-1] == metrics
    assert metrics.startswith("val_loss ")
    assert sorted(p.name for p in out.iterdir()) == [".lock", "last.pt"]


@pytest.mark.parametrize(
    ("answers", "classes"),
    [
        ({"optimizer": "adamw"}, "AdamW and LambdaLR"),
        ({"scheduler": "onecycle"}, "SGD and OneCycleLR"),
    ],
    ids=["another optimizer", "another schedule"],
)
def test_a_checkpoint_of_another_optimizer_or_schedule_is_refused(
    template, project, checkpoint, tmp_path, answers, classes
):
    """What `copier update --data optimizer=...` leaves: last.pt of the old recipe. Resuming
    it is refused in one line that offers --fresh and --init-weights; the weights then
    carry over with --init-weights."""
    other = render(template, tmp_path / "other", **answers)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(checkpoint, out / "last.pt")
    flags = [*TINY_RUN, "--epochs", "1", "--out-dir", out]  # the same command again
    refused = run(PY, "train.py", *flags, cwd=other, check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"error: {out / 'last.pt'}: made with SGD and LambdaLR, where this project now has "
        f"{classes}: start over with --fresh, or from its weights with --init-weights "
        f"{out / 'last.pt'} --fresh"
    ]
    kept = run(PY, "train.py", *flags, "--init-weights", out / "last.pt", "--fresh", cwd=other)
    assert "resumed" not in kept.stdout
    assert len(read_metrics(out)) == 1


def image_folder(root, broken: str | None = None):
    """Two classes of small images in train/ and val/, 4 and 76 of them in train/; `broken`
    names a file that is not an image at all, put among the training images of the first
    class, where check_info's sample of 64 in 81 does not look (the loader finds it)."""
    from PIL import Image

    for split in ("train", "val"):
        for label, count in (("a", 4), ("b", 76 if split == "train" else 4)):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (12, 12), (60 * (i % 4), 0, 0)).save(folder / f"{i}.png")
    if broken:
        (root / "train" / "a" / broken).write_text("not an image\n")
    return root


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_unreadable_image_is_one_line_naming_it(project, tmp_path, workers):
    """Read in a loader worker, its error is one line too, without the worker's traceback."""
    data = image_folder(tmp_path / "images", broken="4.png")  # training item 4 of 81
    flags = ["--data", "imagefolder", "--data-dir", data, "--image-size", "8", "--batch-size", "4"]
    flags += ["--workers", workers, "--epochs", "1", "--out-dir", tmp_path / "out"]
    result = run(PY, "train.py", *flags, cwd=project, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {data}/train/a/4.png: cannot read this image (not an image PIL knows)"
    ]


DISK_FULL = """
import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["train.py", *sys.argv[2:]]
sys.path.insert(0, ".")
runpy.run_path("train.py", run_name="__main__")
"""


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(project, tmp_path):
    """No file may grow past a size that metrics.csv fits in and a checkpoint does not, as on
    a full disk: the save fails in one line naming the file, and the previous one stays; the
    first save of a run says there was none."""
    out = tmp_path / "out"
    flags = [*TINY_RUN, "--model", "mlp", "--out-dir", out]
    first = run(PY, "-c", DISK_FULL, 20_000, *flags, "--epochs", "1", cwd=project, check=False)
    assert first.returncode == 1 and not list(out.glob("*.pt"))
    assert first.stderr.strip().splitlines() == [
        f"error: {out / 'best.pt'}: cannot write (File too large); there was none before"
    ]
    run(PY, "train.py", *flags, "--epochs", "1", "--fresh", cwd=project)
    before = (out / "last.pt").read_bytes()
    result = run(PY, "-c", DISK_FULL, 20_000, *flags, "--epochs", "2", cwd=project, check=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines in (
        [f"error: {out / name}: cannot write (File too large); the last one stays"]
        for name in ("best.pt", "last.pt")
    ), lines
    assert (out / "last.pt").read_bytes() == before
    assert not list(out.glob(".*.tmp"))


def test_full_shared_memory_for_the_loader_workers_is_one_line(project, tmp_path):
    """A loader worker hands its batch over in shared memory (/dev/shm, small in a container
    by default); where no batch fits (here: no file may grow past 10 kB), one line says so and
    what to do, not that the items do not make a batch."""
    flags = [*TINY_RUN, "--workers", "1", "--out-dir", tmp_path / "out"]
    result = run(PY, "-c", DISK_FULL, 10_000, *flags, cwd=project, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: the loader workers' batches find no room in shared memory (File too large (27)): "
        "give /dev/shm more (docker run --shm-size=2g, say) or run with --workers 0"
    ]


def test_download_without_a_network_is_one_line(project, tmp_path, monkeypatch):
    import urllib.error

    with inside(project):
        import torchvision.datasets.cifar
        from proj.data import DataError, build_dataset

        def offline(*args, **kwargs):
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

        monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", offline)
        args = argparse.Namespace(data="cifar10", data_dir=str(tmp_path), download=True)
        args.__dict__.update(image_size=None, hflip=None)
        with pytest.raises(DataError) as error:
            build_dataset(args)
    assert str(error.value) == (
        f"cifar10: cannot download into {tmp_path} "
        "([Errno -3] Temporary failure in name resolution)"
    )


WITHOUT_TENSORBOARD = """
import runpy, sys
sys.modules["tensorboard"] = None  # as if it were not installed
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_tensorboard_missing_is_one_line_naming_the_package(template, tmp_path):
    """With the tensorboard extra but no tensorboard package, the run stops in one line that
    says what to install, before its first epoch, not with an import's traceback."""
    project = render(template, tmp_path / "p", extras=["tensorboard"])
    out = tmp_path / "out"
    flags = [*TINY_RUN, "--out-dir", out]
    result = run(PY, "-c", WITHOUT_TENSORBOARD, *flags, cwd=project, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: TensorBoard needs its package: pip install tensorboard"
    ]
    assert not (out / "last.pt").exists()


def test_a_fresh_run_keeps_another_runs_tensorboard_curves_aside(template, tmp_path):
    """--fresh into an out-dir with TensorBoard's events of an earlier run moves them to
    tensorboard.bak, as metrics.csv goes to metrics.csv.bak: each folder's curves are one
    run's, not two runs' epochs interleaved. A resumed run adds to its own, writing again the
    rows of its checkpoint (one stopped before an epoch's events misses none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def steps(folder) -> list[int]:
        return [event.step for event in EventAccumulator(str(folder)).Reload().Scalars("lr")]

    project = render(template, tmp_path / "p", extras=["tensorboard", "preemption"])
    out = tmp_path / "out"
    train(project, *TINY_RUN, "--epochs", "2", "--out-dir", str(out))
    shutil.copy(out / "last.pt", tmp_path / "epoch2.pt")
    with inside(project):  # stopped between epoch 3's checkpoint and its row
        import train as project_train

        def killed(self, row):
            raise KeyboardInterrupt

        project_train.MetricsLogger.log = killed
        with pytest.raises(KeyboardInterrupt):
            project_train.main([*TINY_RUN, "--epochs", "3", "--out-dir", str(out)])
    rows = train(project, *TINY_RUN, "--epochs", "4", "--out-dir", str(out))  # resumed: its own
    assert steps(out / "tensorboard") == [1, 2, 3, 4]  # epoch 3's point written on resume
    check_tensorboard(out / "tensorboard", rows)
    # The rows written again keep their spacing in time: that of their elapsed_s.
    events = EventAccumulator(str(out / "tensorboard")).Reload().Scalars("lr")
    for event, row in zip(events[:3], rows, strict=False):
        spacing = event.wall_time - events[0].wall_time
        assert spacing == pytest.approx(row["elapsed_s"] - rows[0]["elapsed_s"], abs=1e-4)
    assert rows[2]["elapsed_s"] > rows[0]["elapsed_s"] + 1e-3
    fresh = [*TINY_RUN, "--epochs", "1", "--lr", "0.05", "--out-dir", str(out)]
    with inside(project):  # stopped in its first epoch, before any row
        import train as project_train

        from tests.test_resume import stop_at_step

        stop_at_step(project_train, [*fresh, "--fresh"], 3)
    assert steps(out / "tensorboard.bak") == [1, 2, 3, 4]
    train(project, *fresh)  # resumed part-way through epoch 1: its folder stays, and the .bak
    assert steps(out / "tensorboard") == [1]
    assert steps(out / "tensorboard.bak") == [1, 2, 3, 4]
    # Resumed from an older checkpoint: metrics.csv is not its history, and the curves of the
    # run that wrote it go aside with it.
    train(project, *TINY_RUN, "--epochs", "3", "--resume", str(tmp_path / "epoch2.pt"),
          "--out-dir", str(out))  # fmt: skip
    assert steps(out / "tensorboard.bak") == [1]
    assert steps(out / "tensorboard") == [1, 2, 3]
