"""Train several rendered projects in one torchrun job: each process runs every project's
train.py in turn, as `python train.py` would, so the start-up cost of torchrun and of
importing torch is paid once. Used by the tests as

    torchrun --standalone --nproc-per-node=2 tests/ddp_runner.py RESULTS PROJECT... -- FLAGS

or with several groups of projects, each with its flags:
RESULTS PROJECT... -- FLAGS -- PROJECT... -- FLAGS.

Each project writes to PROJECT/runs/ddp; rank 0 appends one line per project to RESULTS:
the project's folder and "ok" or the error.
"""

from __future__ import annotations

import datetime
import os
import runpy
import socket
import sys
import traceback
from pathlib import Path

import torch.distributed as dist


def train_project(project: Path, flags: list[str]) -> None:
    package = next(p.parent.name for p in project.glob("*/__init__.py"))
    old_cwd, old_path = os.getcwd(), list(sys.path)
    os.chdir(project)
    sys.path.insert(0, str(project))
    sys.argv = ["train.py", "--out-dir", "runs/ddp", *flags]
    try:
        runpy.run_path("train.py", run_name="__main__")
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
        for name in list(sys.modules):
            if name.split(".")[0] == package:
                del sys.modules[name]


def fresh_rendezvous(store: dist.TCPStore, key: str) -> None:
    """Point the next init_process_group at a new store on a free port: a process group
    made again over the same store would find the previous one's keys."""
    if int(os.environ["RANK"]) == 0:
        with socket.socket() as s:
            s.bind((os.environ["MASTER_ADDR"], 0))
            store.set(key, str(s.getsockname()[1]))
    os.environ["MASTER_PORT"] = store.get(key).decode()
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"


def main() -> None:
    results, *rest = sys.argv[1:]
    runs = []  # (project, its flags)
    while rest:
        split = rest.index("--")
        end = rest.index("--", split + 1) if "--" in rest[split + 1 :] else len(rest)
        runs += [(Path(p).resolve(), rest[split + 1 : end]) for p in rest[:split]]
        rest = rest[end + 1 :]
    rank = int(os.environ["RANK"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(minutes=5),
    )
    for index, (project, flags) in enumerate(runs):
        fresh_rendezvous(store, f"port-{index}")
        try:
            train_project(project, flags)
            outcome = "ok"
        except BaseException as error:  # SystemExit too: report it, go on with the others
            outcome = f"failed: {type(error).__name__}: {error}".replace("\n", " ")
            traceback.print_exc()
        if rank == 0:
            with open(results, "a") as f:
                f.write(f"{project}\t{outcome}\n")


if __name__ == "__main__":
    main()
