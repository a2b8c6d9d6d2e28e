"""FSDP against DDP: peak memory per process and samples/s, two processes under torchrun.

    python bench/fsdp_memory.py [--quick] [--repeats N] [--keep DIR] [--device cuda]

The template is rendered twice with its default answers but `distributed`: `ddp` and
`fsdp`. Each trains torchvision's ResNet-18 (11.2 million parameters: its training state,
weights, gradients and SGD's momentum, is about 134 MB in float32 per copy) on the built-in
synthetic images at 32x32 for one epoch, on two processes started by torchrun (on a CPU
over gloo; with --device cuda, one GPU each over NCCL). The two alternate, --repeats times
(3 by default).

Peak memory: on a CPU, the largest resident set of the training processes
(`resource.getrusage(RUSAGE_CHILDREN).ru_maxrss` in a process that runs torchrun and
nothing else: the largest of its descendants'); on CUDA, `torch.cuda.max_memory_allocated`
on rank 0, as train.py's process reports it at exit. A process's resident memory also
holds torch itself, the data set and the activations, which sharding does not divide; the
training state is counted exactly in tests/test_fsdp.py (half of DDP's on two processes).
samples/s: metrics.csv's `samples_per_s` (all processes together). Median over the
repeats.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

MODEL = "resnet18"
REPEATS = 3
# Runs a command and reports the largest resident set of its processes (Linux: KiB).
CHILDREN_PEAK = """\
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print("maxrss", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""
# Reports CUDA's peak allocation of the process at exit, then runs train.py as a script.
CUDA_PEAK = """\
import atexit, os, runpy, sys, torch
sys.path.insert(0, os.getcwd())
atexit.register(lambda: print("peak", torch.cuda.max_memory_allocated(), flush=True)
                if os.environ.get("RANK") == "0" else None)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def train(project: Path, flags: list[str], out: Path, cuda: bool) -> tuple[float, float]:
    """One torchrun job of two processes; (peak bytes per process, samples/s)."""
    script = ["train.py"]
    if cuda:
        (project / "cuda_peak.py").write_text(CUDA_PEAK)
        script = ["cuda_peak.py"]
    command = [sys.executable, "-c", CHILDREN_PEAK, sys.executable, "-m", "torch.distributed.run"]
    command += ["--standalone"]
    command += ["--nproc-per-node=2", *script, *flags, "--out-dir", str(out), "--fresh"]
    result = subprocess.run(command, cwd=project, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{project.name}: torchrun exited {result.returncode}\n{result.stderr}")
    rows = common.read_metrics(out)
    if cuda:
        peak = float(result.stdout.split("peak ")[-1].split()[0])
    else:  # the job's own largest process, measured in a process of its own
        peak = float(result.stderr.split("maxrss ")[-1].split()[0]) * 1024
    return peak, rows[-1]["samples_per_s"]


def main(argv: list[str] | None = None) -> str:
    options = common.parser(__doc__).parse_args(argv)
    title = "### FSDP against DDP: memory per process and samples/s, two processes"
    if options.project is not None:
        return f"{title}\n\nNot run: it renders projects of its own, which --project cannot give."
    cuda = options.device.startswith("cuda")
    repeats = options.repeats or (1 if options.quick else REPEATS)
    size = "64" if options.quick else "512"
    flags = ["--model", MODEL, "--image-size", "32", "--synthetic-size", size, "--epochs", "1"]
    flags += ["--batch-size", "32", "--workers", "0", "--device", "cuda" if cuda else "cpu"]
    results: dict[str, list[tuple[float, float]]] = {"ddp": [], "fsdp": []}
    started = time.perf_counter()
    with common.workdir(options.keep) as work:
        projects = {}
        for answer in results:
            common.log(f"fsdp memory: rendering {answer}")
            projects[answer] = common.render(work / answer, distributed=answer, extras=[])
        for repeat in range(repeats):
            for answer in ("fsdp", "ddp"):
                peak, speed = train(projects[answer], flags, work / f"out-{answer}", cuda)
                results[answer].append((peak, speed))
                common.log(f"  {answer} #{repeat}: peak {peak / 2**20:.0f} MiB, {speed:.1f}/s")
    rows = []
    for answer, measured in results.items():
        peak = statistics.median(p for p, _ in measured)
        speed = statistics.median(s for _, s in measured)
        rows.append([answer, f"{peak / 2**20:,.0f}", f"{speed:,.1f}"])
    ratio = [statistics.median(p for p, _ in results[a]) for a in ("fsdp", "ddp")]
    speeds = [statistics.median(s for _, s in results[a]) for a in ("fsdp", "ddp")]
    what = "peak allocated on the GPU, MiB" if cuda else "peak resident memory, MiB"
    device = "CUDA, NCCL" if cuda else f"CPU, gloo, {os.cpu_count()} cores"
    return "\n\n".join(
        [
            title,
            f"torchvision's {MODEL} (11.2 M parameters) on the built-in synthetic images at "
            f"32x32, {size} of them, batch 32 per process, one epoch, two processes ({device}); "
            f"median of {repeats} runs each, alternating; {time.perf_counter() - started:.0f} s "
            "in all. On a CPU the peak is the largest training process's resident memory, "
            "torch and the data set included, which sharding does not divide.",
            common.table(["distributed", what, "samples/s (both processes)"], rows),
            f"FSDP / DDP: peak memory {ratio[0] / ratio[1]:.2f}x, samples/s "
            f"{speeds[0] / speeds[1]:.2f}x.",
        ]
    )


if __name__ == "__main__":
    print(main())
