"""FSDP against DDP: peak memory per process and samples/s, two processes under torchrun.

    python bench/fsdp_memory.py [--quick] [--repeats N] [--keep DIR] [--device cuda]

The template is rendered twice with its default answers but `distributed`: `ddp` and
`fsdp`. Each trains torchvision's ResNet-18 and Wide ResNet-50-2 (11.7 and 68.9 million
parameters: their training state, weights, gradients and SGD's momentum, is about 140 MB
and 830 MB in float32 per copy) on the built-in synthetic images at 32x32 for one epoch, on
two processes started by torchrun (on a CPU over gloo; with --device cuda, one GPU each over
NCCL). The two alternate, --repeats times (2 by default).

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

MODELS = {"resnet18": 11.7, "wide_resnet50_2": 68.9}  # torchvision's, millions of parameters
REPEATS = 2
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
    flags = ["--image-size", "32", "--synthetic-size", size, "--epochs", "1", "--batch-size"]
    flags += ["32", "--workers", "0", "--device", "cuda" if cuda else "cpu"]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    started = time.perf_counter()
    with common.workdir(options.keep) as work:
        projects = {}
        for answer in ("ddp", "fsdp"):
            common.log(f"fsdp memory: rendering {answer}")
            projects[answer] = common.render(work / answer, distributed=answer, extras=[])
        for model in MODELS:
            for repeat in range(repeats):
                for answer in ("fsdp", "ddp"):
                    out = work / f"out-{answer}"
                    peak, speed = train(projects[answer], ["--model", model, *flags], out, cuda)
                    results.setdefault((model, answer), []).append((peak, speed))
                    common.log(
                        f"  {model} {answer} #{repeat}: {peak / 2**20:.0f} MiB, {speed:.1f}/s"
                    )
    rows, ratios = [], []
    for model, millions in MODELS.items():
        medians = {}
        for answer in ("ddp", "fsdp"):
            measured = results[model, answer]
            medians[answer] = [statistics.median(m[i] for m in measured) for i in (0, 1)]
            peak, speed = medians[answer]
            rows.append(
                [f"{model} ({millions} M)", answer, f"{peak / 2**20:,.0f}", f"{speed:,.1f}"]
            )
        memory, speed = (medians["fsdp"][i] / medians["ddp"][i] for i in (0, 1))
        ratios.append(f"{model}: peak memory {memory:.2f}x, samples/s {speed:.2f}x")
    what = "peak allocated on the GPU, MiB" if cuda else "peak resident memory, MiB"
    device = "CUDA, NCCL" if cuda else f"CPU, gloo, {os.cpu_count()} cores"
    return "\n\n".join(
        [
            title,
            f"torchvision's models on the built-in synthetic images at 32x32, {size} of them, "
            f"batch 32 per process, one epoch, two processes ({device}); median of {repeats} "
            f"runs each, alternating; {time.perf_counter() - started:.0f} s in all. On a CPU "
            "the peak is the largest training process's resident memory, torch and the data "
            "set included.",
            common.table(["model", "distributed", what, "samples/s (both processes)"], rows),
            "FSDP / DDP: " + "; ".join(ratios) + ".",
        ]
    )


if __name__ == "__main__":
    print(main())
