"""Run every CPU benchmark and write bench/RESULTS.md (what `make bench` does).

    python bench/run_all.py [--quick] [--threads N] [--output PATH] [--device cuda]
                            [--project DIR] [--repeats N] [--only SCRIPT ...]

Each benchmark runs in a process of its own (so none inherits another's warm caches or
threads) and prints a markdown section; this script puts them under a header naming the
machine and the versions they were measured on. With --quick every benchmark uses tiny
sizes and one repeat: a smoke check, and the file is written to build/RESULTS-quick.md
unless --output says otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

BENCHMARKS = (
    "line_counts.py",
    "loop_overhead.py",
    "overhead_breakdown.py",
    "lightning_compare.py",
    "data_pipeline.py",
    "time_to_accuracy.py",
    "startup.py",
    "lr_finder.py",
    "fsdp_memory.py",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own choice)"
    )
    parser.add_argument("--output", type=Path, default=None, help="where to write the results")
    parser.add_argument("--only", nargs="*", default=None, help="run only these scripts")
    parser.add_argument("--note", default="", help="a line for the header, e.g. on the load")
    parser.add_argument("--device", default="cpu", help="cpu or cuda, for every benchmark")
    parser.add_argument("--repeats", type=int, default=None, help="pairs per row, for every one")
    parser.add_argument(
        "--project", type=Path, default=None, help="a project rendered already (see common.py)"
    )
    options = parser.parse_args(argv)
    output = options.output or (
        common.ROOT / ("build/RESULTS-quick.md" if options.quick else "bench/RESULTS.md")
    )
    env = dict(os.environ)
    if options.threads:
        env.update(OMP_NUM_THREADS=str(options.threads), MKL_NUM_THREADS=str(options.threads))
    sections, failed = [], []
    started = time.perf_counter()
    for script in BENCHMARKS:
        if options.only and script not in options.only:
            continue
        common.log(f"=== {script}")
        t0 = time.perf_counter()
        result = subprocess.run(
            [sys.executable, str(Path(__file__).parent / script)]
            + (["--quick"] if options.quick else [])
            + ["--device", options.device]
            + (["--repeats", str(options.repeats)] if options.repeats else [])
            + (["--project", str(options.project.resolve())] if options.project else []),
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        minutes = (time.perf_counter() - t0) / 60
        common.log(f"=== {script}: {minutes:.1f} min, exit {result.returncode}")
        if result.returncode != 0:
            failed.append(script)
            sections.append(f"### {script}\n\nFAILED (exit {result.returncode}).")
        else:
            sections.append(result.stdout.strip())
    info = common.machine()
    info["torch threads"] = env.get("OMP_NUM_THREADS", info["torch threads"])
    header = [
        "# Benchmark results"
        + (" (quick smoke check: sizes too small to mean much)" if options.quick else ""),
        "Written by bench/run_all.py (`make bench` on the CPU, `PART=bench bash bench/gpu.sh` "
        "on a GPU); bench/README.md says what each benchmark measures and how to read its "
        "ratios.",
        f"Measured {datetime.date.today().isoformat()} in "
        f"{(time.perf_counter() - started) / 60:.0f} minutes on:",
        "\n".join(f"- {name}: {value}" for name, value in info.items()),
    ]
    if options.note:
        header.append(f"**Note:** {options.note}")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n\n".join(header + sections) + "\n")
    common.log(f"wrote {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
