"""scripts/slurm.sbatch on a real SLURM: a single-node cluster (tests/slurm_cluster.py) that
these tests start, installing Debian's packages where they are missing. The rendered script
runs unchanged; what differs on a CPU-only cluster is given on the sbatch command line, as
a user would give it. The training processes are held at a known step, or made to fail, by
tests/slurm_site/sitecustomize.py, which the jobs import through PYTHONPATH.

Each job is two srun tasks on the one node, standing in for two nodes: two torchruns that
meet at the rendezvous the script sets up, one process each.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import read_metrics, render
from tests.slurm_cluster import Cluster, ensure_installed
from tests.test_resume import same_training, without_speed

pytestmark = pytest.mark.slow

SITE = Path(__file__).with_name("slurm_site")
# Two tasks on the one node, one CPU each; no GPUs on this cluster.
SBATCH = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0"]
# 4 optimizer steps per epoch (64 images, 8 per process), 3 epochs; --log-interval 1: the
# processes agree to stop at the next step, as scripts/slurm.sbatch advises for slow steps.
FLAGS = ["--device", "cpu", "--deterministic", "--synthetic-size", "64", "--image-size", "8"]
FLAGS += ["--workers", "0", "--batch-size", "8", "--epochs", "3", "--log-interval", "1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = ensure_installed()
    if reason:
        pytest.skip(f"no SLURM test cluster: {reason}")
    with Cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    return render(
        template, tmp_path_factory.mktemp("slurm-project") / "p", distributed="ddp", amp="off"
    )


def submit(
    cluster: Cluster, project: Path, out_dir: str, *flags: str, sbatch=SBATCH, **env: str
) -> int:
    """sbatch scripts/slurm.sbatch with FLAGS and `flags`, this Python's tools first on PATH."""
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    env["PYTHONPATH"] = str(SITE)
    args = [*sbatch, "scripts/slurm.sbatch", *FLAGS, *flags, "--out-dir", out_dir]
    return cluster.sbatch(args, cwd=project, env=env)


def output(project: Path, job: int) -> str:
    return (project / f"slurm-{job}.out").read_text()


def final_states(cluster: Cluster, job: int) -> list[str]:
    """sacct's record of each run of the job (a requeued one has several)."""
    fields = ["sacct", "-c", "-j", str(job), "-n", "-P", "-o", "State"]
    return cluster.run(*fields).stdout.split()


def test_a_job_trains_then_a_preempted_one_requeues_and_resumes_bit_identically(
    cluster, project, tmp_path
):
    # An uninterrupted job: two srun tasks, two torchruns, one run of two processes.
    whole = submit(cluster, project, "runs/whole")
    assert cluster.wait(whole, timeout=300) == "COMPLETED", output(project, whole)[-3000:]
    log = output(project, whole)
    assert "2 x cpu" in log and "x 2 processes" in log, log[-3000:]
    details = cluster.job(whole)
    assert (details["NumNodes"], details["NumTasks"], details["Restarts"]) == ("1", "2", "0")
    assert final_states(cluster, whole) == ["COMPLETED"]
    assert [row["epoch"] for row in read_metrics(project / "runs/whole")] == [1, 2, 3]
    assert (project / "runs/whole/best.pt").is_file()

    # The same flags, held at step 6 and signalled there as SLURM does before a time limit
    # (#SBATCH --signal=B:USR1@120: the batch script only).
    marker = tmp_path / "held"
    job = submit(cluster, project, "runs/preempted", HOLD_AT=f"5 {marker}")
    deadline = time.monotonic() + 180
    while not all(Path(f"{marker}.{rank}").exists() for rank in range(2)):
        assert time.monotonic() < deadline, f"{cluster.state(job)}\n{cluster.logs()}"
        time.sleep(0.2)
    cluster.run("scancel", "--signal=USR1", "--batch", str(job))
    assert cluster.wait(job, timeout=300) == "COMPLETED", output(project, job)[-3000:]
    log = output(project, job)
    assert "stopped at epoch 2, step 6" in log, log[-3000:]
    assert "resumed from runs/preempted/last.pt: 1 epoch done, step 6" in log, log[-3000:]
    assert cluster.job(job)["Restarts"] == "1"
    assert final_states(cluster, job)[-1] == "COMPLETED"
    out, reference = project / "runs/preempted", project / "runs/whole"
    same_training(reference / "last.pt", out / "last.pt")
    assert without_speed(read_metrics(out)) == without_speed(read_metrics(reference))


def test_a_failing_rank_fails_the_job_without_requeueing_it(cluster, project):
    """Here one task whose torchrun starts the two processes (NPROC_PER_NODE, as on nodes
    without GPUs), the second of which fails."""
    one_task = ["--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2", "--gpus-per-node=0"]
    job = submit(
        cluster, project, "runs/failing", sbatch=one_task, FAIL_AT="5 1", NPROC_PER_NODE="2"
    )
    assert cluster.wait(job, timeout=300) == "FAILED", output(project, job)[-3000:]
    assert "2 x cpu" in output(project, job)
    assert "rank 1: failing on purpose at step 6" in output(project, job)
    assert cluster.job(job)["Restarts"] == "0"
    checkpoint = torch.load(project / "runs/failing/last.pt", weights_only=True)
    assert checkpoint["progress"]["epoch"] == 1  # the end of epoch 1: nothing after it saved


@pytest.fixture(scope="module")
def fsdp_project(template, tmp_path_factory):
    dest = tmp_path_factory.mktemp("slurm-fsdp") / "p"
    return render(template, dest, distributed="fsdp", amp="off", extras=["preemption"])


def test_the_fsdp_project_s_job_preempted_in_every_process_requeues_from_its_shards(
    cluster, fsdp_project, tmp_path
):
    """The FSDP project's scripts/slurm.sbatch as rendered (two srun tasks, two torchruns, one
    sharded run of two processes) and a preemption as SLURM delivers it to job steps: SIGTERM
    to every process of the steps (scancel --signal=TERM without --batch: the batch script is
    not told), loader workers included. Held at step 6 and signalled there, the run writes
    its shards and last.pt, the job is requeued, resumes from them and ends at epoch 3, step
    12, its last.pt naming a whole folder of shards written by two processes. (That a resume
    is bit-identical is shown with torchrun, tests/test_fsdp.py; DDP's job and SIGUSR1 to
    the batch script, above.)"""
    marker = tmp_path / "held"
    out = "runs/step-signalled"
    job = submit(cluster, fsdp_project, out, "--workers", "1", HOLD_AT=f"5 {marker}")
    deadline = time.monotonic() + 180
    while not all(Path(f"{marker}.{rank}").exists() for rank in range(2)):
        assert time.monotonic() < deadline, f"{cluster.state(job)}\n{cluster.logs()}"
        time.sleep(0.2)
    cluster.run("scancel", "--signal=TERM", str(job))
    assert cluster.wait(job, timeout=300) == "COMPLETED", output(fsdp_project, job)[-3000:]
    log = output(fsdp_project, job)
    assert "2 x cpu" in log and "x 2 processes" in log, log[-3000:]
    assert "SIGTERM: stopped at epoch 2, step 6" in log, log[-3000:]
    assert f"resumed from {out}/last.pt: 1 epoch done, step 6" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert cluster.job(job)["Restarts"] == "1"
    assert final_states(cluster, job)[-1] == "COMPLETED"
    assert [row["epoch"] for row in read_metrics(fsdp_project / out)] == [1, 2, 3]
    last = torch.load(fsdp_project / out / "last.pt", weights_only=True)
    assert (last["progress"]["epoch"], last["progress"]["step"]) == (3, 12)
    assert len(last["processes"]) == 2
    shards = fsdp_project / out / last["shards"]
    assert (shards / ".metadata").is_file()
    assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
