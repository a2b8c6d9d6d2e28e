"""Checkpoints that never lose work: exact resume after kill -9 and after preemption
signals, atomic writes, safe loading, and runs that stop on non-finite losses."""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tests.helpers import WITH_EMA, inside, read_metrics, render, run, script_exit, train

PY = sys.executable
PAUSE_AT = str(Path(__file__).with_name("pause_at.py"))
SITE = Path(__file__).with_name("slurm_site")  # holds processes at a step, for launch.sh too
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
REQUEUE_EXIT = 75
# 10 optimizer steps per epoch, 2 epochs: room to interrupt anywhere.
RUN = ["--deterministic", "--device", "cpu", "--synthetic-size", "160", "--image-size", "8"]
RUN += ["--batch-size", "16", "--epochs", "2", "--log-interval", "1"]


def tensors_equal(a, b, path="") -> None:
    """Assert two checkpoint trees are the same, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            tensors_equal(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            tensors_equal(x, y, f"{path}/{i}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def same_training(done, resumed, differ: tuple[str, ...] = ()) -> None:
    """The two checkpoints hold the same training, bit for bit; `differ` names fields of
    `progress` allowed to differ (elapsed_s, wall-clock time, always)."""
    a = torch.load(done, weights_only=True)
    b = torch.load(resumed, weights_only=True)
    assert a.keys() == b.keys()
    for state in (a, b):
        for name in ("elapsed_s", *differ):
            del state["progress"][name]
        state["progress"]["history"] = without_speed(state["progress"]["history"])
    for part in ("model", "optimizer", "scheduler", "ema", "guard", "progress", "sums"):
        if part in a:  # "ema" and "guard" only with their extras
            tensors_equal(a[part], b[part], part)


def without_speed(rows: list[dict]) -> list[dict]:
    timings = ("samples_per_s", "elapsed_s")
    return [{k: v for k, v in row.items() if k not in timings} for row in rows]


def checkpoint_step(path) -> int:
    try:
        return torch.load(path, weights_only=True)["progress"]["step"]
    except (FileNotFoundError, RuntimeError, EOFError):
        return -1


def stop_at_step(train, flags: list[str], step: int) -> None:
    """Run `train.main(flags)` in this process until optimizer step `step` begins, where the
    run gets its own SIGUSR1 (a scheduler's notice), checkpoints and stops."""
    taken = []

    def stop(optimizer, args, kwargs):
        taken.append(1)
        if len(taken) == step:
            os.kill(os.getpid(), signal.SIGUSR1)

    hook = register_optimizer_step_pre_hook(stop)
    try:
        with pytest.raises(train.Stopped):
            train.main(flags)
    finally:
        hook.remove()


def interrupt_at(
    cmd, cwd, steps: int, sig: int, markers: int = 1, timeout=180, whom="process", clean=False
) -> int:
    """Run `cmd` (train.py and its flags) under tests/pause_at.py, held before optimizer step
    `steps` + 1 of this process; send `sig` to it there (to torchrun, with `markers` = the
    processes, which are all held) and return its exit status. `whom`: "process", or
    "group": the process group it leads, its loader workers too (a shell's job control).
    `clean`: the run must end without a traceback."""
    marker = cwd / f".paused-{os.getpid()}-{time.monotonic_ns()}"
    names = [marker] if markers == 1 else [f"{marker}.{rank}" for rank in range(markers)]
    script = cmd.index("train.py")
    cmd = [*cmd[:script], PAUSE_AT, str(steps), str(marker), *cmd[script:]]
    job = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + timeout
    try:
        while not all(os.path.exists(name) for name in names):
            assert job.poll() is None, job.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach the step"
            time.sleep(0.05)
        if whom == "group":
            assert len(descendants(job.pid)) >= 2  # the loader workers are there to signal
            os.killpg(job.pid, sig)
        else:
            job.send_signal(sig)
        output = job.communicate(timeout=120)[0].decode()
    finally:
        if job.poll() is None:
            job.kill()
        for name in names:
            Path(name).unlink(missing_ok=True)
    assert "pause_at:" not in output, output[-3000:]
    assert not clean or "Traceback" not in output, output[-3000:]
    return job.returncode


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    # EMA on and momentum SGD: more state that must come back exactly.
    return render(template, tmp_path_factory.mktemp("resume") / "p", extras=WITH_EMA)


@pytest.fixture(scope="module")
def ddp_project(template, tmp_path_factory):
    return render(
        template,
        tmp_path_factory.mktemp("ddp") / "p",
        distributed="ddp",
        extras=WITH_EMA,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "loading",
    [
        ["--workers", "0", "--data-on-device", "off"],
        ["--workers", "2", "--data-on-device", "off"],
        ["--data-on-device", "on"],
    ],
    ids=["0 workers", "2 workers", "data on device"],
)
def test_kill_9_anywhere_then_resume_is_bit_identical(project, tmp_path, loading):
    flags = [*RUN, *loading]
    run(PY, "train.py", *flags, "--out-dir", tmp_path / "whole", cwd=project)

    out = tmp_path / "interrupted"
    cmd = [PY, "train.py", *flags, "--save-every", "1", "--out-dir", str(out)]
    kill_steps = sorted(random.Random(" ".join(loading)).sample(range(2, 18), 2))
    done = 0
    for step in kill_steps:  # killed with step `step` checkpointed and the next one started
        assert interrupt_at(cmd, project, step - done, signal.SIGKILL) == -9
        assert checkpoint_step(out / "last.pt") == step
        done = step
    result = run(*cmd, cwd=project)
    assert "resumed from" in result.stdout
    same_training(tmp_path / "whole/last.pt", out / "last.pt")
    assert without_speed(read_metrics(out)) == without_speed(read_metrics(tmp_path / "whole"))


def descendants(pid: int) -> list[int]:
    """The processes that `pid` started, and theirs (none of one that ended meanwhile)."""
    children = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(child) for child in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):  # a short-lived one (dirname, mktemp)
        return []
    return children + [grandchild for child in children for grandchild in descendants(child)]


def command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):  # it ended since it was listed
        return b""


WITH_WORKERS = [*RUN, "--workers", "2", "--data-on-device", "off"]


@pytest.fixture(scope="module")
def whole_with_workers(project, tmp_path_factory):
    """The out-dir of an unbroken run with loader workers."""
    out = tmp_path_factory.mktemp("whole")
    run(PY, "train.py", *WITH_WORKERS, "--out-dir", out, cwd=project)
    return out


@pytest.mark.parametrize(
    ("sig", "whom", "exit_code"),
    [
        (signal.SIGTERM, "process", REQUEUE_EXIT),
        (signal.SIGTERM, "group", REQUEUE_EXIT),
        (signal.SIGUSR1, "group", REQUEUE_EXIT),
        (signal.SIGINT, "group", 130),
    ],
    ids=["SIGTERM process", "SIGTERM group", "SIGUSR1 group", "SIGINT group"],
)
def test_preemption_signal_checkpoints_and_exits_for_requeue(
    project, whole_with_workers, tmp_path, sig, whom, exit_code
):
    """SLURM's and the cloud's stop signals, and Ctrl-C, to the training process or to its
    whole process group, loader workers included: the step under way finishes, is saved, and
    the run exits with 75 (requeue me) or 130 (interrupted); the same command then resumes to
    the end an unbroken run reaches, its elapsed_s counting on from the checkpoint's."""
    out = tmp_path / "preempted"
    cmd = [PY, "train.py", *WITH_WORKERS, "--save-every", "5", "--out-dir", str(out)]
    start = time.monotonic()
    status = interrupt_at(cmd, project, 7, sig, whom=whom, clean=True)  # during step 8
    stopped_after = time.monotonic() - start
    assert status == exit_code
    assert checkpoint_step(out / "last.pt") == 8  # that step finished, then saved
    state = torch.load(out / "last.pt", weights_only=True)
    assert 0 < state["progress"]["elapsed_s"] < stopped_after  # the run's own time
    # A count saved far beyond any run's own time: the resumed rows hold it plus no more than
    # the resumed run's own time, however slow the machine (one that counted from zero
    # again would need 11 days to reach it).
    carried = state["progress"]["elapsed_s"] = 1e6
    torch.save(state, out / "last.pt")
    start = time.monotonic()
    run(*cmd, cwd=project)
    resumed_for = time.monotonic() - start
    same_training(whole_with_workers / "last.pt", out / "last.pt")
    rows = read_metrics(out)
    assert carried < rows[0]["elapsed_s"] <= rows[1]["elapsed_s"] < carried + resumed_for
    assert all(row["samples_per_s"] > 0 for row in rows)  # both epochs trained some steps


@pytest.mark.parametrize(
    ("rendered", "count", "job"),
    [
        ("project", "SLURM_RESTART_COUNT", "SLURM_JOB_ID"),
        ("ddp_project", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID"),
    ],
)
def test_a_restarted_job_goes_on_from_its_own_checkpoint(
    request, rendered, tmp_path, monkeypatch, capsys, count, job
):
    """torchrun's restarts and SLURM's requeues run a job's command again: with --fresh (or
    --resume of another checkpoint) every restart would start over. A restarted job goes on
    from its own last.pt, and only from its own: another job's last.pt in the same --out-dir
    (a finished run's) is what --fresh was given for. Outside a restart, --fresh starts over."""
    project = request.getfixturevalue(rendered)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    out = tmp_path / "job"
    flags = [*RUN, "--workers", "0", "--model", "mlp", "--fresh", "--out-dir", str(out)]
    monkeypatch.setenv(job, "another")
    train(project, *flags, "--epochs", "1")  # another job's run, finished in this --out-dir
    monkeypatch.setenv(job, "this")
    monkeypatch.setenv(count, "1")  # restarted before this job's first checkpoint
    capsys.readouterr()
    assert [row["epoch"] for row in train(project, *flags, "--epochs", "1")] == [1]
    assert "resumed from" not in capsys.readouterr().out
    monkeypatch.setenv(count, "2")  # restarted after it: goes on from it
    assert [row["epoch"] for row in train(project, *flags)] == [1, 2]
    assert f"resumed from {out / 'last.pt'}: 1 epoch done, step 10\n" in capsys.readouterr().out
    monkeypatch.setenv(count, "0")
    assert [row["epoch"] for row in train(project, *flags, "--epochs", "1")] == [1]
    assert "resumed from" not in capsys.readouterr().out


# train.py with its data set held while it loads, until a notice has come (30 s at most): the
# run has started (main keeps the scheduler's notices) and its training has not.
HELD_WHILE_LOADING = """
import os, runpy, signal, sys, time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, os.getcwd())
import proj.data as data

real, marker = data.build_dataset, Path(sys.argv[1])


def held(args):
    from proj import preemption

    marker.write_text(str(os.getpid()))
    waited = time.monotonic()
    while not preemption.early and time.monotonic() - waited < 30:
        time.sleep(0.02)
    return real(args)


data.build_dataset = held
sys.argv = ["train.py", *sys.argv[2:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_a_notice_while_the_run_starts_stops_it_after_its_first_step(project, tmp_path):
    """A SIGTERM that comes while the data loads, to a process that inherited it ignored (as
    scripts/launch.sh starts torchrun), is not lost: the run stops after its first step with
    a checkpoint and exits with 75, for the scheduler to requeue it."""
    marker, out = tmp_path / "loading", tmp_path / "out"
    flags = [*RUN, "--workers", "0", "--model", "mlp", "--out-dir", str(out)]

    def ignored():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    cmd = [sys.executable, "-c", HELD_WHILE_LOADING, str(marker), *flags]
    process = subprocess.Popen(
        cmd, cwd=project, preexec_fn=ignored, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 75, err.decode()
    assert err.decode().strip().splitlines()[-1] == (
        f"SIGTERM: stopped at epoch 1, step 1; checkpoint saved in {out}: run the same "
        "command to resume"
    )
    assert torch.load(out / "last.pt", weights_only=True)["progress"]["step"] == 1


@pytest.mark.parametrize(
    ("given", "again"),
    [
        ({}, "run the same command"),
        ({"fresh": True}, "run it again without --fresh"),
        ({"resume": Path("other.pt")}, "run it again without --resume"),
    ],
)
def test_a_preempted_run_says_how_to_resume(project, given, again):
    with inside(project):
        from proj.checkpoint import Progress
        from proj.preemption import Preemption

    args = argparse.Namespace(out_dir="out", save_every_minutes=0, fresh=False, resume=None)
    preemption = Preemption(argparse.Namespace(**{**vars(args), **given}))
    preemption.received = "SIGTERM"
    stopped = preemption.stopped(Progress(epoch=2, step=30))
    assert str(stopped) == (
        f"SIGTERM: stopped at epoch 3, step 30; checkpoint saved in out: {again} to resume"
    )


@pytest.mark.slow
def test_ddp_preempted_then_resumed_is_bit_identical(ddp_project, tmp_path):
    # The loader path with its per-process sampler (the other DDP tests keep the training
    # set on the device, the default on a CPU).
    flags = [*RUN, "--workers", "0", "--data-on-device", "off"]
    run(*TORCHRUN, "train.py", *flags, "--out-dir", tmp_path / "whole", cwd=ddp_project)
    out = tmp_path / "preempted"
    cmd = [*TORCHRUN, "train.py", *flags, "--out-dir", str(out), "--save-every", "4"]
    # SIGTERM to torchrun, as SLURM or a cloud scheduler does: it passes it to both workers.
    status = interrupt_at(cmd, ddp_project, 4, signal.SIGTERM, markers=2)
    assert status != 0
    assert checkpoint_step(out / "last.pt") == 5  # the step under way finished, then saved
    result = run(*cmd, cwd=ddp_project)
    assert "resumed from" in result.stdout
    same_training(tmp_path / "whole/last.pt", out / "last.pt")
    # Each process resumed its own share of the epoch's losses, not rank 0's.
    assert without_speed(read_metrics(out)) == without_speed(read_metrics(tmp_path / "whole"))
    # Stopped after the last step of epoch 1, the resumed run trained none of it.
    assert [math.isnan(row["samples_per_s"]) for row in read_metrics(out)] == [True, False]


def launch_env(**extra: str) -> dict:
    """The environment of scripts/launch.sh in these tests: 2 processes, this Python's torchrun."""
    path = f"{Path(PY).parent}:{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "NPROC_PER_NODE": "2", **extra}


def launch_sh(project, flags, env: dict) -> subprocess.Popen:
    """scripts/launch.sh with train.py's `flags`, started as a terminal's shell starts a job:
    leading a process group, with SIGINT and SIGQUIT at their defaults (a test run in the
    background of a script inherits them ignored, and a script cannot trap what it was
    started ignoring); its output, stderr too, on stdout."""

    def as_a_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)

    return subprocess.Popen(
        ["scripts/launch.sh", *map(str, flags)],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=as_a_job,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "whom"),
    [
        ("SIGTERM", "script"),
        ("SIGUSR1", "group"),
        ("SIGTERM", "every process"),
        ("SIGINT", "group"),
    ],
)
def test_launch_sh_passes_a_preemption_on_whoever_is_signalled(ddp_project, tmp_path, sig, whom):
    """scripts/launch.sh with loader workers, signalled as a scheduler may do it: the script
    alone (a batch shell), its process group (job control), or every process of the job
    (torchrun, the training processes and their loader workers, as a job step is), or
    Ctrl-C in its terminal (SIGINT to its process group). The training processes checkpoint
    at the signal, nothing prints a traceback, and the script exits with 75 (130 after
    Ctrl-C); run again, it resumes and completes."""
    out = tmp_path / "out"
    flags = [*RUN, "--workers", "2", "--data-on-device", "off", "--out-dir", out]
    marker = tmp_path / "held"
    env = launch_env(PYTHONPATH=str(SITE), HOLD_AT=f"4 {marker}")  # held before step 5
    env["LOGLEVEL"] = "INFO"  # torchrun logs the configuration it was given
    job = launch_sh(ddp_project, flags, env)
    try:
        deadline = time.monotonic() + 180
        while not all(Path(f"{marker}.{rank}").exists() for rank in range(2)):
            assert job.poll() is None, job.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach the step"
            time.sleep(0.05)
        everyone = [job.pid, *descendants(job.pid)]
        assert len(everyone) >= 6  # the script, torchrun, 2 processes with a worker each (2 CPUs)
        if whom == "script":
            os.kill(job.pid, getattr(signal, sig))
        elif whom == "group":
            os.killpg(job.pid, getattr(signal, sig))
        else:
            for pid in everyone:
                os.kill(pid, getattr(signal, sig))
        output = job.communicate(timeout=150)[0].decode()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == (130 if sig == "SIGINT" else REQUEUE_EXIT), output[-3000:]
    assert "Traceback" not in output and "FAILED" not in output, output[-3000:]
    # No restart of a failed job unless MAX_RESTARTS asks: a failure is not a preemption.
    assert re.search(r"max_restarts +: 0\n", output), output[:3000]
    assert f"{sig}: stopped at epoch 1, step 5; checkpoint saved in {out}" in output
    assert checkpoint_step(out / "last.pt") == 5
    if whom == "every process":  # run again from another folder: --out-dir is the caller's
        env.pop("HOLD_AT")
        here = [*flags[:-1], out.name]
        resumed = run(ddp_project / "scripts/launch.sh", *here, cwd=out.parent, env=env)
        assert "resumed from" in resumed.stdout
        assert [row["epoch"] for row in read_metrics(out)] == [1, 2]


@pytest.mark.slow
def test_launch_sh_stops_on_a_ctrl_c_that_comes_before_training(ddp_project, tmp_path):
    """Ctrl-C while torchrun starts, before the training processes exist (torchrun ignores it
    for them): the script notes it, the processes stop as they begin, without a traceback,
    and the script exits with 130, having trained nothing."""
    out = tmp_path / "out"
    job = launch_sh(ddp_project, [*RUN, "--workers", "0", "--out-dir", out], launch_env())
    try:
        deadline = time.monotonic() + 60
        while not any(b"torchrun" in command_line(pid) for pid in descendants(job.pid)):
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)  # torchrun is importing torch: its processes are seconds away
        assert len(descendants(job.pid)) == 1
        os.killpg(job.pid, signal.SIGINT)
        output = job.communicate(timeout=150)[0].decode()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "FAILED" not in output, output[-3000:]
    assert output.count("interrupted before training began") == 2, output[-3000:]
    assert not (out / "last.pt").exists()


@pytest.mark.slow
def test_torchrun_restarts_a_killed_rank_and_the_run_completes(ddp_project, tmp_path):
    out = tmp_path / "out"
    marker = tmp_path / "paused"
    cmd = [*TORCHRUN, "--max-restarts=2", PAUSE_AT, "4", marker, "train.py", *RUN]
    cmd += ["--workers", "0", "--save-every", "2", "--out-dir", out]
    job = subprocess.Popen(
        [str(c) for c in cmd], cwd=ddp_project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 180
        held = [tmp_path / "paused.0", tmp_path / "paused.1"]
        while not all(path.exists() for path in held):  # both hold step 5, step 4 saved
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(int(held[1].read_text()), signal.SIGKILL)
        output = job.communicate(timeout=150)[0].decode()
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, output[-3000:]
    assert "resumed from" in output and "0 epochs done, step 4" in output
    assert [row["epoch"] for row in read_metrics(out)] == [1, 2]


def test_a_part_way_epoch_resumes_only_with_its_batch_size(project, tmp_path):
    """Where a checkpoint from the middle of an epoch goes on depends on the images per batch:
    another --batch-size would repeat or skip images of that epoch, so it is refused in one
    line; a checkpoint from the end of an epoch resumes with any batch size."""
    flags = [*RUN, "--workers", "0", "--model", "mlp", "--epochs", "1"]
    run(PY, "train.py", *flags, "--out-dir", tmp_path / "a", cwd=project)
    state = torch.load(tmp_path / "a/last.pt", weights_only=True)
    assert state["args"]["batch_size"] == 16
    # As a preemption three batches into the second epoch leaves it (test above).
    state["progress"].update(batch=3, step=state["progress"]["step"] + 3)
    torch.save(state, tmp_path / "part-way.pt")
    more = ["--model", "mlp", "--epochs", "2", "--out-dir", tmp_path / "b", "--batch-size", "8"]
    refused = run(
        PY, "train.py", *RUN, *more, "--resume", tmp_path / "part-way.pt", cwd=project, check=False
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'part-way.pt'}: saved part-way through epoch 2 with batches of 16 "
        "x 1 accumulation; finish that epoch with --batch-size 16 --accum-steps 1 (a checkpoint "
        "from the end of an epoch takes any)"
    ]
    # Other accumulation windows would make other optimizer steps of the rest of the epoch.
    accumulated = [*RUN, "--model", "mlp", "--epochs", "2", "--accum-steps", "2"]
    accumulated += ["--resume", tmp_path / "part-way.pt", "--out-dir", tmp_path / "e"]
    code, _ = script_exit(project, *accumulated)
    assert code.endswith(
        "with batches of 16 x 1 accumulation; finish that epoch with "
        "--batch-size 16 --accum-steps 1 (a checkpoint from the end of an epoch takes any)"
    )
    resumed = run(PY, "train.py", *RUN, *more, "--resume", tmp_path / "a/last.pt", cwd=project)
    assert "resumed from" in resumed.stdout
    # The run goes on in b, with its history.
    assert [row["epoch"] for row in read_metrics(tmp_path / "b")] == [1, 2]
    # A checkpoint as v0.6.0 wrote it (format 1) is refused in one line; its weights load.
    torch.save(as_format_1(state), tmp_path / "older.pt")
    more[more.index(tmp_path / "b")] = tmp_path / "c"
    older = [*RUN, *more, "--resume", tmp_path / "older.pt", "--out-dir", tmp_path / "d"]
    code, stderr = script_exit(project, *older)  # it holds d's lock until the test ends
    assert (code, stderr) == (
        f"error: {tmp_path / 'older.pt'}: written by v0.6.0 or earlier, whose runs this release "
        f"cannot resume: start from its weights with --init-weights {tmp_path / 'older.pt'} "
        "--fresh",
        "",
    )
    run(PY, "train.py", *RUN, *more, "--init-weights", tmp_path / "older.pt", cwd=project)
    rows = read_metrics(tmp_path / "c")
    assert [row["epoch"] for row in rows] == [1, 2] and math.isfinite(rows[0]["train_loss"])


def as_format_1(state: dict) -> dict:
    """A checkpoint of one process as v0.5.0 and v0.6.0 wrote it (format 1): the epoch's
    sums as losses times images, the random states as a list, no classes nor elapsed time."""
    keep = ("model", "optimizer", "scheduler", "ema", "args")
    old = {k: v for k, v in state.items() if k in keep}
    images = state["args"]["batch_size"]
    loss, finite = (state["sums"]["totals"] * images).tolist()
    old["meter"] = {"loss": loss, "finite": finite, "seen": finite}
    old["meter"]["bad_steps"] = state["guard"]["bad_steps"]
    old["pending"] = {
        "losses": [(loss, images) for loss in state["sums"]["pending"]],
        "bad": state["guard"]["pending"],
    }
    old["rng"] = [state["rng"]]
    progress = {k: v for k, v in state["progress"].items() if k not in ("elapsed_s", "history")}
    old["progress"] = {**progress, "best_acc": progress.pop("best")}
    old["batch_layout"] = [images, 1]
    return old


def test_an_average_missing_from_the_checkpoint_starts_from_the_loaded_weights(
    project, tmp_path, monkeypatch, capsys
):
    """A checkpoint without an average of the weights (written before the ema extra was
    chosen) resumes with an average that starts from the weights it loaded, not from the
    freshly initialised ones, with the --ema-decay given. The ema_val_ metrics are those of
    the average: --eval-only of its weights reports them."""
    flags = [*RUN[1:], "--workers", "0", "--model", "mlp", "--out-dir", str(tmp_path)]
    run(PY, "train.py", *flags, "--epochs", "1", cwd=project)
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    saved["ema"] = None
    del saved["args"]["ema_decay"]  # as a project without the extra wrote it
    torch.save(saved, tmp_path / "older.pt")
    averaged_from, decays = [], set()
    with inside(project):
        import train

        update = train.EMA.update

        def first_update(ema, model):
            if not averaged_from:
                averaged_from.append({k: v.clone() for k, v in ema.module.state_dict().items()})
            decays.add(ema.decay)
            update(ema, model)

        monkeypatch.setattr(train.EMA, "update", first_update)
        resume = ["--resume", str(tmp_path / "older.pt"), "--ema-decay", "0.9"]
        train.main([*flags, "--epochs", "2", *resume])
        state = torch.load(tmp_path / "last.pt", weights_only=True)
        torch.save({**state, "model": state["ema"]["module"]}, tmp_path / "average.pt")
        capsys.readouterr()
        train.main([*flags, "--eval-only", "--init-weights", str(tmp_path / "average.pt")])
    tensors_equal(averaged_from[0], saved["model"])
    assert decays == {0.9}
    row = read_metrics(tmp_path)[-1]
    loss, acc = map(float, capsys.readouterr().out.split()[1:4:2])
    assert loss == pytest.approx(row["ema_val_loss"], abs=1e-6)
    assert acc == pytest.approx(row["ema_val_acc"], abs=1e-6)
    assert (row["ema_val_loss"], row["ema_val_acc"]) != (row["val_loss"], row["val_acc"])


def dropout_mlp(name, info):
    """A model that draws random numbers while it trains, which the built-in ones do not."""
    hidden, num_classes = 64, info.num_classes
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(math.prod(info.input_shape), hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.5),
        torch.nn.Linear(hidden, num_classes),
    )


@pytest.mark.parametrize(("stop_at", "on_device"), [(3, "on"), (13, "off")])
def test_a_model_with_dropout_resumes_bit_identically(
    project, tmp_path, monkeypatch, stop_at, on_device
):
    """Dropout's masks come from the global random generator: a run stopped part-way (by its
    own SIGUSR1, sent as step `stop_at` starts) continues bit for bit only if the random
    state saved in the checkpoint comes back on resuming, and if nothing else draws from it
    (the training loader has a generator of its own: the resumed run starts one more)."""
    flags = [*RUN, "--workers", "0", "--model", "mlp", "--data-on-device", on_device]
    whole, out = tmp_path / "whole", tmp_path / "stopped"
    clock = [0.0]  # train.py's: a second per optimizer step, nothing else takes time
    hook = register_optimizer_step_pre_hook(lambda *_: clock.__setitem__(0, clock[0] + 1))
    with inside(project):
        import train

        monkeypatch.setattr(train, "build_model", dropout_mlp)
        monkeypatch.setattr(train, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
        try:
            train.main([*flags, "--out-dir", str(whole)])
            stop_at_step(train, [*flags, "--out-dir", str(out)], stop_at)
            assert checkpoint_step(out / "last.pt") == stop_at
            train.main([*flags, "--out-dir", str(out)])
        finally:
            hook.remove()
    same_training(whole / "last.pt", out / "last.pt")
    # Samples a second counts what this run trained, not the batches before its resume.
    assert [row["samples_per_s"] for row in read_metrics(out)] == [16.0, 16.0]


def test_a_second_ctrl_c_interrupts_at_once(project):
    """The first Ctrl-C asks the run to stop after its step; the second, as usual, raises
    KeyboardInterrupt at once (train.py reports it in one line, exit status 130)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with inside(project):
            from proj.preemption import Preemption

            args = argparse.Namespace(
                out_dir="runs", save_every_minutes=0, fresh=False, resume=None
            )
            with Preemption(args) as stop:
                # To this thread, which has run the handler when raise_signal returns.
                signal.raise_signal(signal.SIGINT)
                assert stop.received == "SIGINT"
                with pytest.raises(KeyboardInterrupt):
                    signal.raise_signal(signal.SIGINT)
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
