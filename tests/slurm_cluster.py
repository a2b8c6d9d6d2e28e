"""A throwaway single-node SLURM cluster (munged, slurmctld, slurmd) for tests.

Runs as root on Debian/Ubuntu, where `ensure_installed` can apt-get the packages:

    reason = ensure_installed()
    if reason:
        pytest.skip(reason)
    with start_cluster(tmp_path) as cluster:
        job = cluster.sbatch(["script.sbatch"], cwd=tmp_path)
        assert cluster.wait(job) == "COMPLETED"

Each cluster runs its own munged (key and socket in its directory), so clusters side by side
(one per xdist worker) share nothing but the CPUs. Every daemon and job gets
MARKER="<owner pid> <cluster dir>" in its environment: `stop` kills whatever is left of its
cluster by it, and `start` whatever test runs that were killed left behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
COMMANDS = ["slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "sinfo", "sacct"]
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
MARKER = "SLURM_TEST_CLUSTER"
PATH = os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"  # daemons live in sbin

# Time limits and --signal=...@N act on slurmctld's fixed 30 s timer: signals come up to 30 s early.
CONF = """\
ClusterName=test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
# Our own munged's socket. cred_expire also delays a requeued job's restart (by
# cred_expire + 1 s); 5 is the minimum.
AuthInfo=socket={dir}/munge.socket,cred_expire=5
# No cgroups: track job processes by parent pid, which works in any container.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
# Schedule CPUs only (not memory), so 1-CPU jobs and tasks share the node.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobRequeue=1
# Job ids of its own, so that clusters side by side give jobs different ids (and ports).
FirstJobId={first_job_id}
ReturnToService=2
# Seconds between SIGTERM and SIGKILL when a job step ends (SLURM's default): a preempted
# run has that long to checkpoint.
KillWait=30
# Keep finished jobs visible to `scontrol show job` for an hour.
MinJobAge=3600
# Pending jobs (e.g. requeued ones) are tried every second instead of every 60.
SchedulerParameters=sched_interval=1
# No slurmdbd: `sacct -c` reads finished jobs from the JobCompLoc file instead.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={dir}/jobcomp.txt
{node_line} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def ensure_installed() -> str | None:
    """Return None when SLURM and MUNGE are usable (installing them if need be), else why not."""
    if os.geteuid() != 0:
        return "the SLURM test cluster needs root"
    if _missing():
        if not shutil.which("apt-get"):
            return f"SLURM is missing ({', '.join(_missing())}) and there is no apt-get"
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
        for cmd in (["apt-get", "update"], install):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode:
                last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
                return f"`{' '.join(cmd)}` failed: {last[0]}"
    return f"still missing after apt-get: {', '.join(_missing())}" if _missing() else None


def _missing() -> list[str]:
    return [c for c in COMMANDS if not shutil.which(c, path=PATH)]


class Cluster:
    """One partition `debug` with this host as its only node; jobs run as root."""

    def __init__(self, tmp_dir: str | os.PathLike):
        self.dir = Path(tmp_dir).resolve() / "slurm"
        self.node = socket.gethostname().split(".")[0]
        self.marker = f"{os.getpid()} {self.dir}"
        conf = str(self.dir / "slurm.conf")
        self.env = {**os.environ, "PATH": PATH, "SLURM_CONF": conf, MARKER: self.marker}
        self._daemons: list[subprocess.Popen] = []

    def start(self, timeout: float = 30) -> Cluster:
        """Write the config, start the daemons and wait until the node is idle."""
        _kill_marked(self.marker)
        _kill_marked(None)
        shutil.rmtree(self.dir, ignore_errors=True)
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(parents=True)
        # This host as slurmd sees it: "NodeName=vm CPUs=2 Boards=1 ... RealMemory=... UpTime=..."
        node_line = self.run("slurmd", "-C").stdout.splitlines()[0]
        node_line = re.sub(r" (RealMemory|UpTime)=\S*", "", node_line)  # memory: not scheduled
        ports = dict(zip(("ctld_port", "slurmd_port"), _free_ports(2), strict=True))
        # From the system's randomness: the random module's state is whatever the test
        # process's in-process training seeded it to, the same in every xdist worker.
        first_job_id = random.SystemRandom().randrange(1, 1_000_000)
        conf = CONF.format(
            dir=self.dir, node=self.node, node_line=node_line, first_job_id=first_job_id, **ports
        )
        (self.dir / "slurm.conf").write_text(conf)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # --force: munged (as root) refuses a socket whose directories not everyone can enter,
        # such as pytest's tmp_path.
        self._launch(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={self.dir}/munge.socket",
            f"--pid-file={self.dir}/munged.pid",
            f"--seed-file={self.dir}/munged.seed",
        )
        deadline = time.monotonic() + timeout
        while not (self.dir / "munge.socket").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._launch("slurmctld", "-D")
        self._launch("slurmd", "-D")
        sinfo = ("sinfo", "-h", "-n", self.node, "-o", "%T")
        while self.run(*sinfo, check=False).stdout.strip() != "idle":
            if time.monotonic() > deadline or any(d.poll() is not None for d in self._daemons):
                logs = self.logs()
                self.stop()
                raise RuntimeError(f"SLURM node {self.node} did not become idle:\n{logs}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        """Shut the daemons down and kill whatever is left of them and of jobs."""
        daemons, self._daemons = self._daemons, []
        if len(daemons) == 3:
            self.run("scontrol", "shutdown", check=False, timeout=10)
        for daemon in reversed(daemons):  # slurmd, slurmctld: they exit on shutdown; munged
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(timeout=0 if daemon.args[0] == "munged" else 10)
            daemon.terminate()
            daemon.wait()
        gone = _kill_marked(self.marker)
        deadline = time.monotonic() + 10
        while any(map(_alive, gone)) and time.monotonic() < deadline:
            time.sleep(0.1)

    def _launch(self, *cmd: str) -> None:
        with open(self.dir / f"{cmd[0]}.out", "w") as out:
            popen = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=out)
        self._daemons.append(popen)

    def run(self, *cmd: str, check=True, env=None, **kwargs) -> subprocess.CompletedProcess:
        """Run a SLURM command against this cluster (extra `env` on top of ours), capturing
        its text output."""
        kwargs.setdefault("timeout", 60)
        env = {**self.env, **(env or {})}
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=check, **kwargs)

    def sbatch(self, args: list[str], cwd: str | os.PathLike, env: dict | None = None) -> int:
        """Submit a job (`args` as for sbatch, extra `env` on top of ours); return its id."""
        done = self.run("sbatch", "--parsable", *args, cwd=cwd, env=env, check=False)
        if done.returncode:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {done.stderr.strip()}")
        return int(done.stdout.split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """The job's fields from `scontrol show job` (JobState, Restarts, ExitCode, ...)."""
        line = self.run("scontrol", "-o", "show", "job", str(job_id)).stdout
        return dict(re.findall(r"(\S+?)=(\S*)", line))

    def state(self, job_id: int) -> str:
        """The job's state: PENDING, RUNNING, COMPLETED, FAILED, ..."""
        return self.job(job_id)["JobState"]

    def wait(self, job_id: int, timeout: float = 120) -> str:
        """Wait until the job has finished for good (requeued runs included); return its state."""
        deadline = time.monotonic() + timeout
        while (state := self.state(job_id)) not in FINAL_STATES:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {state} after {timeout} s\n{self.logs()}")
            time.sleep(0.5)
        return state

    def logs(self, lines: int = 20) -> str:
        """The last lines of each daemon's log, for error messages."""
        tails = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out", "munged.out"):
            path = self.dir / name
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            tails.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(tails)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def start_cluster(tmp_dir: str | os.PathLike):
    """Context manager: a started Cluster under tmp_dir, stopped on exit."""
    with Cluster(tmp_dir) as cluster:
        yield cluster


def _free_ports(count: int) -> list[int]:
    """`count` ports free now, and different: each socket is held until all are bound."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _kill_marked(marker: str | None) -> list[int]:
    """SIGKILL the processes (daemons, slurmstepd, jobs) whose MARKER is `marker`, or with
    None, those whose owner has died; return their pids."""
    killed = []
    pattern = re.compile(rb"(?:^|\0)" + MARKER.encode() + rb"=([^\0]*)")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError, ValueError):
            found = pattern.search((proc / "environ").read_bytes())
            value = found[1].decode() if found else None
            if value and (value == marker if marker else not _alive(int(value.split()[0]))):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not: it waits for a parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
