"""Distributed training with real torchrun processes talking over gloo."""

from __future__ import annotations

import functools
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import (
    AMPS,
    OPTIMIZERS,
    SCHEDULERS,
    WITH_EMA,
    inside,
    read_metrics,
    render,
    ruff,
    run,
    train,
)
from tests.test_device_data import as_process
from tests.test_matrix import OTHER_ANSWERS, check_nothing_left_out
from tests.test_robustness import HOLD_LOCK

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
RUNNER = os.path.join(os.path.dirname(__file__), "ddp_runner.py")
QUICK = ["--device", "cpu", "--synthetic-size", "48", "--image-size", "8", "--workers", "0"]
QUICK += ["--batch-size", "8"]


def torchrun(project, *flags, check=True, **kwargs):
    return run(*TORCHRUN, "train.py", *flags, cwd=project, check=check, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("amp", AMPS)
def test_every_combination_trains_on_two_processes(template, tmp_path, amp):
    """amp x optimizer x scheduler with distributed=ddp, the extras spread over them as in the
    matrix: every combination rendered with nothing of what the answers left out and ruff
    clean. A third of them train, by two processes in one torchrun job (tests/ddp_runner.py
    runs each project's train.py): over the three amp values, every optimizer-schedule pair
    trains once, and each amp trains every optimizer twice and every schedule three times
    (the single-process matrix trains all of them)."""
    projects, trained = [], []
    for o, optimizer in enumerate(OPTIMIZERS):
        for s, scheduler in enumerate(SCHEDULERS):
            dest = tmp_path / f"{optimizer}-{scheduler}"
            extras = OTHER_ANSWERS["extras"][len(projects) % len(OTHER_ANSWERS["extras"])]
            answers = dict(amp=amp, optimizer=optimizer, scheduler=scheduler, extras=extras)
            # Runs give --batch-size 8; an answer of 128 renders the batch of a short run too.
            size = (8, 128)[len(projects) // 2 % 2]
            projects.append(
                render(template, dest, distributed="ddp", batch_size=size, epochs=1, **answers)
            )
            check_nothing_left_out(projects[-1], {"distributed": "ddp", **answers})
            if (o + s) % len(AMPS) == AMPS.index(amp):
                trained.append(projects[-1])
    assert ruff("check", "--no-cache", *projects).returncode == 0
    assert ruff("format", "--check", "--no-cache", *projects).returncode == 0

    results = tmp_path / "results.tsv"
    flags = QUICK + ([] if amp == "off" else ["--amp", amp])
    run(*TORCHRUN, RUNNER, results, *trained, "--", *flags, timeout=900)
    outcomes = dict(line.split("\t") for line in results.read_text().splitlines())
    assert outcomes == {str(p): "ok" for p in trained}
    assert len(trained) == len(OPTIMIZERS) * len(SCHEDULERS) // len(AMPS)
    for project in trained:
        rows = read_metrics(project / "runs/ddp")
        assert len(rows) == 1 and math.isfinite(rows[0]["train_loss"]), project


@pytest.fixture(scope="module")
def ddp_project(template, tmp_path_factory):
    return render(
        template,
        tmp_path_factory.mktemp("ddp") / "p",
        distributed="ddp",
        extras=WITH_EMA,
    )


@pytest.fixture(scope="module")
def single_project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("single") / "p", extras=WITH_EMA)


def test_single_rendering_has_no_distributed_code(single_project):
    files = [p for p in single_project.rglob("*") if p.is_file() and p.suffix in (".py", ".sh")]
    for path in files:
        text = path.read_text()
        for word in ("torch.distributed", "DistributedDataParallel", "torchrun", "RANK"):
            assert word not in text, f"{path.name} mentions {word}"
    assert not (single_project / "scripts").exists()


def test_ddp_project_runs_as_one_process(ddp_project, tmp_path):
    run(sys.executable, "train.py", *QUICK, "--epochs", "1", "--out-dir", tmp_path, cwd=ddp_project)
    assert len(read_metrics(tmp_path)) == 1


def test_a_short_run_counts_the_optimizer_steps_of_a_process_share(ddp_project, tmp_path):
    """Without --batch-size the batch of a short run is chosen from each process's steps: 10
    epochs of 1500 items on 2 processes are 10 x 5 steps at 128 (750 items each), 10 x 11 at
    64 and 10 x 23 at 32. Counted over all 1500 items, 64 would do (10 x 23 = 230 steps)."""
    flags = [*QUICK[: QUICK.index("--batch-size")], "--model", "mlp", "--synthetic-size", "1500"]
    result = torchrun(ddp_project, *flags, "--epochs", "10", "--out-dir", tmp_path)
    said = "batch 32, not 128: 10 epochs of 750 items are 50 optimizer steps at 128, 230 at 32"
    assert result.stdout.count(said) == 1, result.stdout
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (state["args"]["batch_size"], state["progress"]["step"]) == (32, 10 * 23)


SAVES_LOGGED = """\
import os, runpy, sys
sys.path.insert(0, os.getcwd())
import proj.checkpoint, proj.preemption
from torch.optim.optimizer import register_optimizer_step_post_hook


class Clock:
    \"\"\"preemption.py's clock: each optimizer step of process RANK takes RANK + 1 seconds.\"\"\"

    seconds = 0.0

    @classmethod
    def monotonic(cls):
        return cls.seconds


def tick(optimizer, args, kwargs):
    Clock.seconds += 1 + int(os.environ.get("RANK", 0))


register_optimizer_step_post_hook(tick)
proj.preemption.time = Clock
real = proj.checkpoint.save_checkpoint
def logged(state, path):
    with open(os.environ["SAVES_LOG"], "a") as log:
        log.write(f"{state['progress']['step']} {state['progress']['batch']}\\n")
    real(state, path)
proj.checkpoint.save_checkpoint = logged
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.parametrize("processes", [1, 2])
def test_save_every_minutes_saves_once_a_period(ddp_project, tmp_path, processes):
    """--save-every-minutes checkpoints mid-epoch once each period of its clock, counted from
    the previous save, by one process or by two that agree on it: when the first of them
    reaches its period, both save and count again. The clock is the test's (a second per
    optimizer step, two on the second process), so the saves fall on known steps whatever the
    machine's load. (Processes other than the first once kept their clocks from the start,
    so after the first period the first process saved at every log interval.)"""
    wrapper, log = tmp_path / "logged.py", tmp_path / "saves.log"
    wrapper.write_text(SAVES_LOGGED)
    flags = [*QUICK, "--model", "mlp", "--synthetic-size", "160", "--epochs", "1"]
    flags += ["--log-interval", "1", "--save-every-minutes", "0.0625"]  # 3.75 seconds
    flags += ["--out-dir", str(tmp_path / "out")]
    launcher = [sys.executable] if processes == 1 else TORCHRUN
    env = {**os.environ, "SAVES_LOG": str(log)}
    run(*launcher, wrapper, *flags, cwd=ddp_project, env=env, timeout=300)
    saves = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    # (step, batch in the epoch) of each checkpoint written; 20 steps alone, 10 by each of
    # two, whose second process reaches the period every 2 steps.
    every, steps = (4, 20) if processes == 1 else (2, 10)
    mid_epoch = [(step, step) for step in range(every, steps + 1, every)]
    assert saves == [*mid_epoch, (steps, 0), (steps, 0)]  # then best.pt and last.pt


def test_readme_says_why_ddp_and_not_dataparallel(ddp_project, single_project):
    """A DDP project's README says why DDP; a single-process one only how to change answers."""
    readme = (ddp_project / "README.md").read_text()
    section = readme[readme.index("## Why DDP and not DataParallel") :]
    section = section[: section.index("\n## ", 1)]
    for reason in ("GIL", "one process per GPU", "cannot span machines", "all-reduced"):
        assert reason in section, reason
    single = (single_project / "README.md").read_text()
    assert "DataParallel" not in single
    assert "--data distributed=ddp" in single


def test_help_says_how_to_launch(ddp_project):
    out = run(sys.executable, "train.py", "--help", cwd=ddp_project).stdout
    assert "torchrun --standalone --nproc-per-node=gpu train.py" in out
    assert "--rdzv-endpoint" in out and "sbatch scripts/slurm.sbatch" in out


WRITES_LOGGED = """\
import os, runpy, sys
sys.path.insert(0, os.getcwd())
import proj.checkpoint, proj.logger

def log_write(name):
    with open(os.environ["WRITES_LOG"], "a") as log:
        log.write(f"{os.environ['RANK']} {name}\\n")

real_save, real_log = proj.checkpoint.save_checkpoint, proj.logger.MetricsLogger.log

def save_checkpoint(state, path):
    log_write("save_checkpoint")
    real_save(state, path)

def log(self, row):
    if self.path is not None:  # None: the logger of a process that writes nothing
        log_write("MetricsLogger.log")
    real_log(self, row)

proj.checkpoint.save_checkpoint = save_checkpoint
proj.logger.MetricsLogger.log = log
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_rank_zero_alone_writes_and_checkpoints_are_unwrapped(ddp_project, tmp_path):
    out_dir = tmp_path / "out"
    wrapper, log = tmp_path / "logged.py", tmp_path / "writes.log"
    wrapper.write_text(WRITES_LOGGED)
    result = run(
        *TORCHRUN,
        wrapper,
        *QUICK,
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--accum-steps",
        "2",
        "--out-dir",
        out_dir,
        cwd=ddp_project,
        env={**os.environ, "WRITES_LOG": str(log)},
    )
    writes = log.read_text().splitlines()
    assert writes.count("0 MetricsLogger.log") == 2  # one row per epoch
    assert writes.count("0 save_checkpoint") >= 2  # best.pt and last.pt at each epoch's end
    assert not [write for write in writes if not write.startswith("0 ")], writes
    # One progress summary per epoch: printed by rank 0 only.
    assert result.stdout.count("epoch 1/2 ") == 1 and result.stdout.count("epoch 2/2 ") == 1
    assert "8 per process x 2 processes x 2 accumulation = 32 items" in result.stdout
    written = sorted(p.name for p in out_dir.iterdir())
    assert written == [".lock", "best.pt", "last.pt", "metrics.csv"]  # no leftovers of rank 1
    assert [row["epoch"] for row in read_metrics(out_dir)] == [1, 2]

    state = torch.load(out_dir / "last.pt", weights_only=True)
    for key in list(state["model"]) + list(state["ema"]["module"]):
        assert not key.startswith(("module.", "_orig_mod.")), key
    assert len(state["processes"]) == 2  # each process's RNG and sums, to resume each exactly
    assert state["rng"] == state["processes"][0]["rng"]  # the first's, for one process
    # 48 images / (8 per batch x 2 processes) = 3 batches per epoch, 2 steps with accum 2.
    assert state["progress"]["step"] == 4 and state["scheduler"]["last_epoch"] == 4


SLOW_SAVES = """\
import atexit, os, runpy, signal, sys, time
sys.path.insert(0, os.getcwd())
import proj.checkpoint

def note(event):
    with open(os.environ["EVENTS_LOG"], "a") as log:  # appended in the order they happen
        log.write(f"{os.environ['RANK']} {event}\\n")

real_save = proj.checkpoint.save_checkpoint

def save_checkpoint(state, path):
    time.sleep(1)
    real_save(state, path)
    note("saved " + os.path.basename(path))
    if os.environ.get("PREEMPT") and os.path.basename(path) == "last.pt":
        os.environ.pop("PREEMPT")
        os.kill(os.getpid(), signal.SIGTERM)  # the first process alone is told to stop

proj.checkpoint.save_checkpoint = save_checkpoint
atexit.register(note, "exit")
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.parametrize("preempted", [False, True], ids=["finished", "preempted"])
def test_no_process_exits_before_the_first_has_saved(ddp_project, tmp_path, preempted):
    """At the end of a run, every process waits for the others, the first of them writing
    its checkpoints (slowed here by a second each): a process that exits straight after a
    collective can abort with gloo ("terminate called without an active exception"). So
    does a run stopped by a signal to the first process: the other does not exit before the
    first's checkpoint is written (without scripts/launch.sh, every process exits with the
    status that asks for a requeue, and torchrun would end the first as soon as another
    exits). Here, as under launch.sh, they exit with 0 and leave the status in REQUEUE_FILE."""
    wrapper, log, status = tmp_path / "slow.py", tmp_path / "events.log", tmp_path / "status"
    wrapper.write_text(SLOW_SAVES)
    flags = [*QUICK, "--epochs", "2" if preempted else "1", "--log-interval", "1"]
    flags += ["--out-dir", tmp_path / "out"]
    env = {**os.environ, "EVENTS_LOG": str(log), "PREEMPT": "1" if preempted else ""}
    env["REQUEUE_FILE"] = str(status)
    ran = run(*TORCHRUN, wrapper, *flags, cwd=ddp_project, env=env)
    events = log.read_text().splitlines()
    saves = ["0 saved best.pt", "0 saved last.pt"] + ["0 saved last.pt"] * preempted
    assert events[:-2] == saves, ran.stderr[-2000:]
    assert sorted(events[-2:]) == ["0 exit", "1 exit"]
    if preempted:  # stopped at the first step of epoch 2 (3 steps an epoch)
        assert status.read_text() == "75\n" and "SIGTERM: stopped at epoch 2, step 4" in ran.stderr
        state = torch.load(tmp_path / "out/last.pt", weights_only=True)
        assert state["progress"]["step"] == 4
    else:
        assert not status.exists()


def test_checkpoints_move_between_single_and_ddp(ddp_project, single_project, tmp_path):
    run(
        sys.executable,
        "train.py",
        *QUICK,
        "--epochs",
        "1",
        "--out-dir",
        tmp_path / "s",
        cwd=single_project,
    )
    torchrun(
        ddp_project,
        *QUICK,
        "--epochs",
        "2",
        "--resume",
        tmp_path / "s/last.pt",
        "--out-dir",
        tmp_path / "d",
    )
    assert [row["epoch"] for row in read_metrics(tmp_path / "d")] == [1, 2]  # with its history
    result = run(
        sys.executable,
        "train.py",
        *QUICK,
        "--epochs",
        "3",
        "--resume",
        tmp_path / "d/last.pt",
        "--out-dir",
        tmp_path / "s2",
        cwd=single_project,
    )
    assert "resumed from" in result.stdout
    assert [row["epoch"] for row in read_metrics(tmp_path / "s2")] == [1, 2, 3]
    # The DDP project as one process (python train.py) goes on from a single process's too.
    more = ["--epochs", "4", "--resume", str(tmp_path / "s2/last.pt")]
    rows = train(ddp_project, *QUICK, *more, "--out-dir", str(tmp_path / "d1"))
    assert [row["epoch"] for row in rows] == [1, 2, 3, 4]


@pytest.mark.parametrize("val_images", [83])  # odd, and ragged for batches of 2 x 8
def test_evaluation_counts_every_sample_once(ddp_project, single_project, tmp_path, val_images):
    flags = [
        *QUICK[:2],
        "--synthetic-size",
        str(val_images * 5),
        "--image-size",
        "8",
        "--workers",
        "0",
        "--batch-size",
        "8",
    ]
    run(
        sys.executable,
        "train.py",
        *flags,
        "--epochs",
        "1",
        "--out-dir",
        tmp_path,
        cwd=single_project,
    )
    single = run(
        sys.executable, "train.py", *flags, "--eval-only", "--out-dir", tmp_path, cwd=single_project
    ).stdout.splitlines()[-1]
    ddp = torchrun(ddp_project, *flags, "--eval-only", "--out-dir", tmp_path).stdout
    ddp_line = [line for line in ddp.splitlines() if line.startswith("val_loss")]
    assert len(ddp_line) == 1, ddp
    # The same samples, each counted once: the same accuracy, and the same loss up to the
    # rounding of float32 sums taken over other batches.
    # val_loss and val_acc come first (the single project's EMA, ema_val_*, after them).
    (ddp_loss, ddp_acc), (loss, acc) = (line.split()[1:4:2] for line in (ddp_line[0], single))
    assert ddp_acc == acc, (ddp_line, single)
    assert float(ddp_loss) == pytest.approx(float(loss), rel=1e-5), (ddp_line, single)
    # Both are the metrics computed here by hand from the checkpoint: every validation image
    # once, normalised, through the model in eval mode (BatchNorm's running statistics).
    with inside(single_project):
        import train
        from proj.data import build_dataset
        from proj.models import build_model

        args = train.get_args_parser().parse_args(flags)
        _, val_set, info = build_dataset(args)
        model = build_model(args.model, info)
        model.load_state_dict(torch.load(tmp_path / "last.pt", weights_only=True)["model"])
    items = [val_set[i] for i in range(len(val_set))]
    images, targets = torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])
    mean, std = (torch.tensor(values).view(1, -1, 1, 1) for values in (info.mean, info.std))
    with torch.no_grad():
        logits = model.eval()((images.float() - mean) / std)
    assert len(targets) == val_images
    expected_loss = F.cross_entropy(logits, targets).item()
    expected_acc = 100 * (logits.argmax(1) == targets).double().mean().item()
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5), single
    assert float(acc) == pytest.approx(expected_acc, abs=1e-5), single


def worker_pids(parent: int) -> dict[int, int]:
    """RANK -> pid of torchrun's worker processes."""
    pids = {}
    for child in subprocess.run(
        ["pgrep", "-P", str(parent)], capture_output=True, text=True
    ).stdout.split():
        try:
            env = open(f"/proc/{child}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                pids[int(item[5:])] = int(child)
    return pids


def test_killed_rank_fails_the_job_quickly(ddp_project, tmp_path):
    """Rank 1 killed while both train (step 1 is checkpointed: both took part in its save):
    the job ends, naming rank 1, well before torchrun's 30 s of grace would run out on a
    process stuck in a collective."""
    cmd = [*TORCHRUN, "train.py", *QUICK, "--synthetic-size", "2000", "--epochs", "50"]
    cmd += ["--save-every", "1", "--out-dir", str(tmp_path)]
    job = subprocess.Popen(
        cmd, cwd=ddp_project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 180  # against a hang only
        while not (tmp_path / "last.pt").exists():
            assert time.monotonic() < deadline and job.poll() is None, "no step was saved"
            time.sleep(0.2)
        os.kill(worker_pids(job.pid)[1], signal.SIGKILL)
        killed = time.monotonic()
        output, _ = job.communicate(timeout=60)
        assert time.monotonic() - killed < 30
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    assert "rank: 1" in output or "rank 1" in output, output[-3000:]


def test_exception_in_one_rank_fails_the_job_naming_it(ddp_project, tmp_path):
    """Rank 1 trips over a checkpoint only it cannot read; the job ends, naming rank 1."""
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    # Rank 0 resumes from nothing; rank 1 is pointed at the bad file via its own env.
    wrapper = tmp_path / "wrap.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        "sys.path.insert(0, os.getcwd())\n"
        f"if os.environ['RANK'] == '1': sys.argv += ['--resume', {str(bad)!r}]\n"
        "runpy.run_path('train.py', run_name='__main__')\n"
    )
    result = run(
        *TORCHRUN,
        wrapper,
        *QUICK,
        "--out-dir",
        tmp_path / "o",
        cwd=ddp_project,
        check=False,
        timeout=180,  # against a hang only: a job left waiting ends after 10 minutes
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"rank 1: error: {bad}: not a readable checkpoint" in output


def test_a_validation_set_smaller_than_the_processes_is_one_line(ddp_project, tmp_path):
    """Each process evaluates its share of the validation set in step with the others: a
    process with no item would wait in a collective the others never reach. Three validation
    items (the fewest the synthetic set makes) for four processes are refused before
    training, in one line from each."""
    four = [*TORCHRUN[:-1], "--nproc-per-node=4", "train.py", *QUICK, "--synthetic-size", "16"]
    result = run(*four, "--out-dir", tmp_path, cwd=ddp_project, check=False, timeout=180)
    output = result.stdout + result.stderr
    line = "error: data set 'synthetic': its validation set has 3 items, fewer than the 4 processes"
    assert result.returncode != 0 and output.count(line) == 4, output
    assert 'train.py", line' not in output


# Rank 0 meets an unreadable file at its third training step, as a loader might (metrics.add
# runs at every micro-batch; the training set is in memory here, not read item by item).
BROKEN_ITEM = """import os, runpy, sys
sys.path.insert(0, os.getcwd())
from proj import metrics

add, calls = metrics.TrainMetrics.add, []

def broken(self, *args):
    calls.append(1)
    if os.environ["RANK"] == "0" and len(calls) == 3:
        raise OSError("cannot read item 5")
    return add(self, *args)

metrics.TrainMetrics.add = broken
runpy.run_path("train.py", run_name="__main__")
"""


def test_a_process_that_stops_in_training_leaves_one_line_from_each(ddp_project, tmp_path):
    """Rank 0 stops at an unreadable item with its one line; rank 1, left waiting in the
    gradients' all-reduce, learns from gloo that its peer has gone and says so in one line,
    not with gloo's traceback. Each line is written whole, not run into the other's."""
    wrapper = tmp_path / "broken.py"
    wrapper.write_text(BROKEN_ITEM)
    flags = [*QUICK, "--epochs", "2", "--out-dir", tmp_path / "o"]
    result = run(*TORCHRUN, wrapper, *flags, cwd=ddp_project, check=False, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "\nrank 0: error: cannot read item 5\n" in output, output
    assert "\nrank 1: stopped: another process ended\n" in output, output
    assert 'train.py", line' not in output, output  # no process's traceback (torchrun has one)


def test_an_out_dir_in_use_stops_every_process_with_one_line(ddp_project, tmp_path):
    """Rank 0 alone locks --out-dir; when another run holds it, every process stops with the
    same line and exit 2, none of them waiting in a collective for rank 0 to die."""
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out / ".lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        result = torchrun(ddp_project, *QUICK, "--out-dir", out, check=False, timeout=180)
    finally:
        holder.kill()
        holder.wait()
    output = result.stdout + result.stderr
    line = f"train.py: error: argument --out-dir: another run is using {out}; wait or pick another"
    assert output.count(line) == 2, output  # each process's (torchrun may then end one)
    assert 'train.py", line' not in output  # no traceback of a process (torchrun has its own)
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--device", "mps"], "argument --device: under torchrun use auto, cuda or cpu"),
        (["--sync-bn", "--device", "cpu"], "argument --sync-bn: needs CUDA"),
    ],
    ids=["device", "sync-bn"],
)
def test_flags_torchrun_cannot_honour_are_refused(ddp_project, monkeypatch, capsys, flags, message):
    """Under torchrun (its RANK and WORLD_SIZE set) each process takes the GPU of its
    LOCAL_RANK: a device named otherwise would have trained quietly on the CPU, and
    SyncBatchNorm on the CPU failed at its first step. Both are one line before anything
    loads; as a single process, neither flag is refused here."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # As on a Mac (a cached function, as torch's own: torch._dynamo looks for __wrapped__).
    monkeypatch.setattr(torch.backends.mps, "is_available", functools.cache(lambda: True))
    with inside(ddp_project):
        import train

        parser = train.get_args_parser()
        args = parser.parse_args(flags)
        with pytest.raises(SystemExit) as exit_info:
            train.check_args(parser, args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]
        monkeypatch.delenv("RANK")
        train.check_args(parser, args)  # not refused outside torchrun


def test_a_loss_non_finite_on_one_rank_is_skipped_by_every_rank(ddp_project, tmp_path):
    """Rank 1 alone gets a NaN loss at its second step; the all-reduced gradients are NaN on
    both ranks, so both must skip that step, or rank 0's weights turn NaN. The skipped step
    is counted once, and training goes on. A step whose loss is NaN on both ranks (the
    second of epoch 2) is counted once too."""
    wrapper = tmp_path / "wrap.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        "import torch.nn.functional as F\n"
        "sys.path.insert(0, os.getcwd())\n"
        "real, calls = F.cross_entropy, []\n"
        "bad = {2, 6} if os.environ['RANK'] == '1' else {6}  # call 4: epoch 1's evaluation\n"
        "def flaky(*args, **kwargs):\n"
        "    calls.append(1)\n"
        "    loss = real(*args, **kwargs)\n"
        "    return loss * float('nan') if len(calls) in bad else loss\n"
        "F.cross_entropy = flaky\n"
        "runpy.run_path('train.py', run_name='__main__')\n"
    )
    out = tmp_path / "o"
    flags = [*QUICK, "--epochs", "2", "--max-bad-steps", "0", "--data-on-device", "on"]
    run(*TORCHRUN, wrapper, *flags, "--out-dir", out, cwd=ddp_project, timeout=300)
    rows = read_metrics(out)
    assert [row["nonfinite_steps"] for row in rows] == [1, 1]
    assert all(math.isfinite(row["train_loss"]) for row in rows)
    state = torch.load(out / "last.pt", weights_only=True)
    for name, tensor in state["model"].items():
        assert torch.isfinite(tensor.float()).all(), name


ALL_REDUCES_COUNTED = """\
import atexit, os, sys
sys.path.insert(0, os.getcwd())
import torch.distributed as dist
import train
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

rounds, seeds = [], []
real_seed_everything = train.seed_everything


def seed_everything(seed, deterministic):  # each process its own seed: dropout masks differ
    seeds.append(seed)
    real_seed_everything(seed, deterministic)


class CountingDDP(train.DDP):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_comm_hook(None, self.count)

    @staticmethod
    def count(group, bucket):
        rounds.append(bucket.index())
        return allreduce_hook(group, bucket)


def report():  # registered first, so it runs last at exit
    with open(os.environ["ROUNDS_LOG"], "a") as log:
        log.write(f"{os.environ['RANK']} {rounds.count(0)} {dist.is_initialized()} {seeds}\\n")


atexit.register(report)
train.DDP = CountingDDP
train.seed_everything = seed_everything
train.main(sys.argv[1:])
train.finish_together()  # as `python train.py` does
"""


def test_gradients_are_all_reduced_once_per_optimizer_step_and_train_loss_over_all(
    ddp_project, tmp_path
):
    """With --accum-steps 4, DDP all-reduces the gradients only on the micro-batch that ends
    each window (counted by a communication hook around DDP's own all-reduce): 10 batches
    per process make windows of 4, 4 and 2, so 3 all-reduces, not 10.

    The same run's train_loss is the mean loss over both processes' batches, which the test
    computes itself: from weights that the run starts from (--init-weights) and that a
    learning rate of 1e-30 leaves bit for bit as they are, on each process's share of the
    training set kept on the device, as that process draws it."""
    wrapper = tmp_path / "count.py"
    wrapper.write_text(ALL_REDUCES_COUNTED)
    log = tmp_path / "rounds.log"
    flags = [*QUICK, "--synthetic-size", "160", "--accum-steps", "4", "--epochs", "1"]
    flags += ["--model", "mlp", "--lr", "1e-30", "--data-on-device", "on"]
    with inside(ddp_project):
        losses, weights = process_losses(flags, tmp_path / "init.pt")
    flags += ["--init-weights", tmp_path / "init.pt", "--out-dir", tmp_path / "o"]
    env = {**os.environ, "ROUNDS_LOG": str(log)}
    run(*TORCHRUN, wrapper, *flags, cwd=ddp_project, env=env, timeout=300)
    # main() called from a script leaves the process group by the time the script exits.
    assert sorted(log.read_text().split("\n")[:-1]) == ["0 3 False [0]", "1 3 False [1]"]
    state = torch.load(tmp_path / "o/last.pt", weights_only=True)
    assert state["progress"]["step"] == 3
    for name, tensor in weights.items():  # the losses were those of these weights
        assert torch.equal(state["model"][name], tensor), name
    assert [len(share) for share in losses] == [10, 10]
    every = losses[0] + losses[1]
    (row,) = read_metrics(tmp_path / "o")
    assert row["train_loss"] == pytest.approx(sum(every) / len(every), rel=1e-12, abs=0)
    # Rank 0's share alone is another number, by far more than the rounding.
    assert abs(sum(losses[0]) / 10 - row["train_loss"]) > 1e-4


def process_losses(flags: list[str], weights_file) -> tuple[list[list[float]], dict]:
    """The loss of each training batch of epoch 1 of each of 2 processes, in float64, with
    the weights of a freshly built model, which are written to `weights_file` as a checkpoint
    for --init-weights. Called inside the project."""
    import train
    from proj import device_data
    from proj.checkpoint import FORMAT
    from proj.data import DeviceBatches, build_dataset
    from proj.models import build_model

    args = train.get_args_parser().parse_args(flags)
    train_set, _, info = build_dataset(args)
    torch.manual_seed(1)
    model = build_model(args.model, info)
    torch.save({"format": FORMAT, "model": model.state_dict()}, weights_file)
    cpu, losses = torch.device("cpu"), []
    for rank in (0, 1):
        with as_process(device_data, rank, 2):
            share = device_data.DeviceData(
                train_set.images, train_set.labels, args.batch_size, args.seed, info.hflip, cpu
            )
        share.set_epoch(0)
        losses.append([])
        for inputs, targets in DeviceBatches(share, info, cpu, args.channels_last):
            with torch.no_grad():
                loss = F.cross_entropy(model(inputs), targets, label_smoothing=args.label_smoothing)
            losses[-1].append(loss.double().item())
    return losses, {name: tensor.clone() for name, tensor in model.state_dict().items()}


TERMS_ON_ONE_PROCESS = """\
import os, sys
sys.path.insert(0, os.getcwd())
import train

real_compute_loss = train.compute_loss


def compute_loss(outputs, targets, *rest):  # a term that only the second process names
    loss = real_compute_loss(outputs, targets, *rest)
    return (loss, {"extra": loss.detach()}) if os.environ["RANK"] == "1" else loss


train.compute_loss = compute_loss
train.main(sys.argv[1:])
"""


def test_terms_named_on_one_process_only_are_one_line_not_a_hang(ddp_project, tmp_path):
    """Each process sums its own terms: processes that name other terms cannot sum them
    together (their all-reduce would wait for ever), and say so."""
    wrapper = tmp_path / "terms.py"
    wrapper.write_text(TERMS_ON_ONE_PROCESS)
    flags = [*QUICK, "--epochs", "1", "--model", "mlp", "--out-dir", tmp_path / "o"]
    result = run(*TORCHRUN, wrapper, *flags, cwd=ddp_project, check=False, timeout=180)
    assert result.returncode != 0
    assert "compute_loss named other terms than ['extra'] elsewhere" in result.stderr
    assert not (tmp_path / "o/last.pt").exists()


STEPS_AND_SHARDS_LOGGED = """\
import os, sys
sys.path.insert(0, os.getcwd())
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
import train
from proj import data

log = open(f"{os.environ['SHARDS_LOG']}.{os.environ['RANK']}", "w")


def gradients(optimizer, args, kwargs):  # what each optimizer step takes
    grads = [p.grad.flatten() for g in optimizer.param_groups for p in g["params"]]
    log.write(f"step {torch.cat(grads).double().abs().sum().item()!r}\\n")


real_getitem = data.SeededSamples.__getitem__


def getitem(self, key):  # the loader's items, in this process (no workers)
    log.write(f"item {key[0]}\\n")
    return real_getitem(self, key)


register_optimizer_step_pre_hook(gradients)
data.SeededSamples.__getitem__ = getitem
train.main(sys.argv[1:])
train.finish_together()
log.close()
"""


def test_processes_train_on_their_own_shards_with_the_same_gradients(ddp_project, tmp_path):
    """Through the loader, with --accum-steps 2 at a learning rate that trains: each process
    loads its own half of the epoch's items, and every optimizer step takes the same
    gradients on both (all-reduced at the last micro-batch of each window)."""
    wrapper = tmp_path / "logged.py"
    wrapper.write_text(STEPS_AND_SHARDS_LOGGED)
    flags = [*QUICK, "--epochs", "1", "--model", "mlp", "--data-on-device", "off"]
    flags += ["--accum-steps", "2", "--out-dir", tmp_path / "o"]
    env = {**os.environ, "SHARDS_LOG": str(tmp_path / "log")}
    run(*TORCHRUN, wrapper, *flags, cwd=ddp_project, env=env, timeout=300)
    logs = [(tmp_path / f"log.{rank}").read_text().splitlines() for rank in (0, 1)]
    items = [{int(line.split()[1]) for line in log if line.startswith("item ")} for log in logs]
    steps = [[line for line in log if line.startswith("step ")] for log in logs]
    assert not items[0] & items[1] and len(items[0] | items[1]) == 48  # 3 batches of 8 each
    assert len(steps[0]) == 2 and steps[0] == steps[1]  # windows of 2 and 1 micro-batches
