"""The rendered project's finders: the learning-rate sweep (--find-lr, --lr auto) and the
batch-size search (--batch-size auto), checked against real training and a real memory
limit."""

from __future__ import annotations

import csv
import os
import re
import runpy
import statistics
import sys

import pytest
import torch

from tests.helpers import inside, render, run, train
from tests.test_resume import same_training

PY = sys.executable
# An MLP on 8x8 images, with the training set kept as one tensor: a few ms a step on a CPU.
FAST = ["--model", "mlp", "--image-size", "8", "--synthetic-size", "1024", "--batch-size", "32"]
FAST += ["--workers", "0", "--device", "cpu", "--data-on-device", "on"]
# Fixed grids of constant learning rates, a quarter of a decade apart, around each
# optimizer's best for FAST (the test checks that the best is inside, not at an end).
GRIDS = {
    "sgd": [0.01, 0.0178, 0.0316, 0.0562, 0.1],
    "adamw": [0.001, 0.00178, 0.00316, 0.00562, 0.01],
}


@pytest.fixture(scope="module")
def projects(template, tmp_path_factory):
    """Constant schedules (a grid of constant learning rates means something), reference
    batch 16; rendered when first asked for."""
    made = {}

    def get(optimizer: str):
        if optimizer not in made:
            dest = tmp_path_factory.mktemp(optimizer) / "p"
            made[optimizer] = render(
                template, dest, optimizer=optimizer, scheduler="constant", batch_size=16
            )
        return made[optimizer]

    return get


def main(project, *flags: str) -> None:
    """Run the project's train.py in this process, as `python train.py FLAGS` would."""
    with inside(project):
        sys.argv = ["train.py", *map(str, flags)]
        runpy.run_path("train.py", run_name="__main__")


def suggested_lr(output: str) -> float:
    return float(re.search(r"suggested lr (\S+)", output).group(1))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", GRIDS)
def test_suggested_lr_is_within_3x_of_the_best_constant_lr(projects, optimizer, capsys):
    project = projects(optimizer)
    out = project / "runs" / "find"
    main(project, *FAST, "--find-lr", "--out-dir", out)
    suggestion = suggested_lr(capsys.readouterr().out)
    lines = (out / "lr_find.csv").read_text().splitlines()
    assert lines[0] == "lr,loss,smoothed_loss" and len(lines) > 30
    written = sorted(path.name for path in out.iterdir() if path.name != ".lock")
    assert written in (["lr_find.csv"], ["lr_find.csv", "lr_find.png"])  # and nothing trained

    final_loss = {}
    for lr in GRIDS[optimizer]:  # 256 steps at each, as one would try them by hand
        flags = ["--lr", str(lr), "--warmup-steps", "0", "--epochs", "8", "--fresh"]
        final_loss[lr] = train(project, *FAST, *flags)[-1]["train_loss"]
    best = min(final_loss, key=final_loss.get)
    report = f"suggested {suggestion}, final training losses {final_loss}"
    assert best not in (GRIDS[optimizer][0], GRIDS[optimizer][-1]), f"grid too narrow: {report}"
    assert best / 3 <= suggestion <= best * 3, report


# Constant learning rates a factor of 2 apart around SGD's best for FAST over 3 epochs.
SGD_GRID = [0.0125, 0.025, 0.05, 0.1]


def test_sweep_stops_where_the_loss_climbs_back_and_suggests_near_the_best_rate(projects, capsys):
    """SGD with its gradients clipped (the default) on FAST: past its best rates the loss
    drifts back towards chance but stays far from 4 times its lowest (the finder's earlier
    rule, which saw no divergence here). The sweep stops at the first step where its
    smoothed loss has climbed back half way from its lowest to where it started, long before
    --find-lr-end; its suggestion is within 3x of the best of a grid of constant rates."""
    project = projects("sgd")
    out = project / "runs" / "climb"
    main(project, *FAST, "--find-lr", "--out-dir", out)
    printed = capsys.readouterr().out
    suggestion = suggested_lr(printed)
    with (out / "lr_find.csv").open(newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    lrs, smoothed = [r["lr"] for r in rows], [r["smoothed_loss"] for r in rows]
    start = statistics.fmean(r["loss"] for r in rows[:10])

    def climbed(step: int) -> float:  # how far back towards the start, from the lowest before
        lowest = min(smoothed[:step])
        return (smoothed[step] - lowest) / (start - lowest)

    assert f"the loss diverged at {lrs[-1]:.3g}" in printed
    assert 30 < len(rows) < 300 and lrs[-1] < 1  # --find-lr-end: 10, after 300 steps
    assert climbed(len(rows) - 2) <= 0.5 < climbed(len(rows) - 1) < 1
    assert smoothed[-1] < 1.5 * min(smoothed)  # no explosion: back towards chance

    final_loss = {}
    for lr in SGD_GRID:
        flags = ["--lr", str(lr), "--warmup-steps", "0", "--epochs", "3", "--fresh"]
        final_loss[lr] = train(project, *FAST, *flags)[-1]["train_loss"]
    best = min(final_loss, key=final_loss.get)
    report = f"suggested {suggestion}, final training losses {final_loss}"
    assert best not in (SGD_GRID[0], SGD_GRID[-1]), f"grid too narrow: {report}"
    assert best / 3 <= suggestion <= best * 3, report


def test_sweep_leaves_the_model_and_the_random_state_alone(projects, tmp_path):
    seen = {}
    with inside(projects("sgd")):
        import train
        from proj import finders

        real_find_lr = finders.find_lr

        def watched(model, *rest):
            weights = {k: v.clone() for k, v in model.state_dict().items()}
            rng = torch.get_rng_state()
            seen["sweep"] = real_find_lr(model, *rest)
            state = model.state_dict()
            seen["model unchanged"] = all(torch.equal(weights[k], state[k]) for k in weights)
            seen["rng unchanged"] = torch.equal(rng, torch.get_rng_state())
            return seen["sweep"]

        finders.find_lr = watched
        # A ResNet, so that BatchNorm statistics are among what must not change.
        flags = [*FAST, "--model", "resnet_small", "--find-lr", "--find-lr-steps", "20"]
        train.main([*flags, "--out-dir", str(tmp_path)])
    assert seen["model unchanged"] and seen["rng unchanged"]
    assert len(set(seen["sweep"].losses)) > 1  # the copy did train


def test_batch_size_auto_leaves_the_random_state_alone(projects, tmp_path):
    """The search trains copies on a sample of augmented items: neither the augmentation nor
    the copies draw from the run's random state, so the run is the one --batch-size N makes."""
    seen = {}
    with inside(projects("sgd")):
        import train

        real = train.auto_batch_size

        def watched(*args):
            rng = torch.get_rng_state()
            real(*args)
            seen["rng unchanged"] = torch.equal(rng, torch.get_rng_state())

        train.auto_batch_size = watched
        flags = [*FAST, "--batch-size", "auto", "--max-batch-size", "32"]
        train.main([*flags, "--out-dir", str(tmp_path)])
    assert seen == {"rng unchanged": True}


def test_accumulation_changes_neither_the_sweep_nor_the_steps_an_epoch(projects, tmp_path, capsys):
    """--accum-steps 2 at batch 16 makes the steps of batch 32 (the MLP has no BatchNorm):
    the sweep records the same losses. --batch-size auto leaves MIN_STEPS (16) optimizer
    steps an epoch counted in accumulated steps: 1024 items, 4 micro-batches a step, 16."""
    swept = {}
    # Through the loader: its items are the same at any batch (on the device, augmentation
    # draws per batch).
    loaded = ["--data-on-device", "off"]
    for batch, accum in ((32, 1), (16, 2)):
        out = tmp_path / f"{batch}x{accum}"
        flags = ["--batch-size", str(batch), "--accum-steps", str(accum), "--find-lr-steps", "30"]
        main(projects("sgd"), *FAST, *flags, *loaded, "--find-lr", "--out-dir", out)
        with (out / "lr_find.csv").open(newline="") as f:
            swept[accum] = [float(row["loss"]) for row in csv.DictReader(f)]
    assert len(swept[1]) == 30 and swept[2] == pytest.approx(swept[1], rel=1e-5)
    capsys.readouterr()
    flags = ["--batch-size", "auto", "--accum-steps", "4", "--epochs", "1"]
    main(projects("sgd"), *FAST, *flags, "--out-dir", tmp_path / "auto")
    found = re.search(r"batch size finder: .*; batch (\d+)", capsys.readouterr().out)
    assert "leaves 16 steps an epoch" in found.group(0) and found.group(1) == "16"


def test_a_sweep_lowest_in_its_first_tenth_is_a_guess(projects):
    with inside(projects("sgd")):
        from proj.finders import LRSweep

        def sweep(lowest: int) -> LRSweep:
            smoothed = [1.0] * 300
            smoothed[lowest] = 0.5
            return LRSweep([1e-3] * 300, smoothed, smoothed, 1e-4, diverged=False)

        assert [sweep(k).guess for k in (0, 29, 30, 299)] == [True, True, False, False]


@pytest.mark.parametrize("scheduler", ["warmup_cosine", "onecycle"])
def test_lr_auto_is_the_peak_of_the_schedule(template, tmp_path, scheduler, capsys):
    """The suggestion is the schedule's peak: half the rate at the sweep's lowest smoothed
    loss (a tenth with a constant schedule; bench/RESULTS.md: scheduled peaks are higher)."""
    project = render(template, tmp_path / "p", scheduler=scheduler)
    train(project, *FAST, "--lr", "auto", "--epochs", "1")
    suggestion = suggested_lr(capsys.readouterr().out)
    with (project / "runs/test/lr_find.csv").open(newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    lowest = min(rows, key=lambda row: row["smoothed_loss"])
    assert suggestion == float(f"{lowest['lr'] / 2:.3g}")
    checkpoint = torch.load(project / "runs/test/last.pt", weights_only=True)
    assert checkpoint["args"]["lr"] == suggestion
    if scheduler == "onecycle":
        group = checkpoint["optimizer"]["param_groups"][0]
        assert group["max_lr"] == suggestion
        assert group["initial_lr"] == pytest.approx(suggestion / checkpoint["args"]["div_factor"])
    else:
        assert checkpoint["scheduler"]["base_lrs"] == [suggestion, suggestion]


def test_resume_reuses_the_batch_size_and_lr_found_at_the_start(projects, capsys):
    project = projects("sgd")
    flags = [*FAST, "--deterministic", "--lr", "auto", "--batch-size", "auto"]
    flags += ["--max-batch-size", "64", "--warmup-epochs", "1", "--fresh"]  # in both schedules
    done, resumed = project / "runs/done", project / "runs/resumed"
    main(project, *flags, "--epochs", "2", "--out-dir", done)
    first = capsys.readouterr().out
    assert "batch size finder: 64 fit" in first  # 16, 32 and 64 tried, 64 is the cap
    main(project, *flags, "--epochs", "1", "--out-dir", resumed)
    capsys.readouterr()
    main(project, *[f for f in flags if f != "--fresh"], "--epochs", "2", "--out-dir", resumed)
    again = capsys.readouterr().out
    assert "resumed from" in again and "finder" not in again
    checkpoint = torch.load(resumed / "last.pt", weights_only=True)
    assert checkpoint["args"]["batch_size"] == 64
    assert checkpoint["args"]["lr"] == suggested_lr(first)  # no linear scaling with lr auto
    # The resumed run goes on with the 1-epoch schedule it began (--more-epochs continue), a
    # constant one here: the same learning rates as the run that was 2 epochs from the start.
    same_training(done / "last.pt", resumed / "last.pt", differ=("schedule_epochs",))


def test_resume_with_batch_size_auto_scales_the_lr_as_the_start_did(projects, capsys, tmp_path):
    """The batch found at the start scaled --lr by the linear rule: the same command resumes
    with the same lr, and so does one without --lr; another --lr is refused, naming both as
    the run would use them."""
    project = projects("sgd")  # reference batch 16
    flags = [*FAST, "--batch-size", "auto", "--max-batch-size", "64", "--out-dir", tmp_path]
    main(project, *flags, "--lr", "0.02", "--epochs", "1")
    main(project, *flags, "--lr", "0.02", "--epochs", "2")
    assert "resumed from" in capsys.readouterr().out
    checkpoint = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (checkpoint["args"]["batch_size"], checkpoint["args"]["lr"]) == (64, 0.02 * 64 / 16)
    main(project, *flags, "--epochs", "3")  # no --lr: the checkpoint's, not the default's
    checkpoint = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (checkpoint["progress"]["epoch"], checkpoint["args"]["lr"]) == (3, 0.02 * 64 / 16)
    with pytest.raises(SystemExit) as refused:
        main(project, *flags, "--lr", "0.05", "--epochs", "4")
    assert refused.value.code == (
        f"error: {tmp_path / 'last.pt'}: resuming goes on with the checkpoint's --lr "
        f"{0.02 * 64 / 16} (given {0.05 * 64 / 16}); to change it, start a new schedule "
        f"(--more-epochs restart) or from its weights with --init-weights {tmp_path / 'last.pt'} "
        "--fresh"
    )


def test_a_loss_that_does_not_move_is_not_divergence(projects):
    """First losses all equal (one full batch in a fixed order, no dropout): the moving
    average of a constant rounds a last bit below it, which is no fall to climb back from."""
    with inside(projects("sgd")):
        from proj.finders import has_diverged

        for constant in (0.1, 0.69, 1.0, 2.3, 1e4):
            losses, smoothed, average = [], [], 0.0
            for step in range(60):
                average = 0.9 * average + 0.1 * constant
                losses.append(constant)
                smoothed.append(average / (1 - 0.9 ** (step + 1)))
                assert not has_diverged(losses, smoothed), (constant, step)
            # A real fall and climb back still counts: a tenth of the loss lost, then regained.
            losses += [0.9 * constant] * 40 + [constant] * 40
            for step in range(60, 140):
                average = 0.9 * average + 0.1 * losses[step]
                smoothed.append(average / (1 - 0.9 ** (step + 1)))
            assert has_diverged(losses, smoothed), constant


def test_a_sweep_that_starts_too_high_says_so(projects, capsys):
    """The default sweep, read back from lr_find.csv: 300 learning rates from 1e-7 up by the
    same factor to 10 (or fewer, stopped where the smoothed loss climbed back half way from
    its lowest to the mean of the first 10 losses, that lowest being 3 of their standard
    deviations below it), the bias-corrected moving average of the losses (weight 0.9 on the
    past), and the suggestion a tenth of the rate of its lowest point. A sweep that starts
    too high says so."""
    project = projects("sgd")
    runs = project / "runs"
    main(project, *FAST, "--find-lr", "--out-dir", runs / "sweep")
    out = capsys.readouterr().out
    assert "very start" not in out
    with (runs / "sweep/lr_find.csv").open(newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    lrs, losses = [row["lr"] for row in rows], [row["loss"] for row in rows]
    assert lrs == pytest.approx([1e-7 * 1e8 ** (k / 299) for k in range(len(rows))], rel=1e-12)
    average, smoothed = 0.0, []
    for k, loss in enumerate(losses):
        average = 0.9 * average + 0.1 * loss
        smoothed.append(average / (1 - 0.9 ** (k + 1)))
    assert [row["smoothed_loss"] for row in rows] == pytest.approx(smoothed, rel=1e-12)
    lowest = min(range(len(rows)), key=smoothed.__getitem__)
    start, spread = statistics.fmean(losses[:10]), statistics.pstdev(losses[:10])
    spread = max(spread, start / 1000)

    def climbed_back(k: int) -> bool:
        below = min(smoothed[:k])
        return start - below > 3 * spread and smoothed[k] > below + (start - below) / 2

    assert not any(climbed_back(k) for k in range(10, len(rows) - 1))
    assert len(rows) == 300 or climbed_back(len(rows) - 1)
    assert suggested_lr(out) == float(f"{lrs[lowest] / 10:.3g}")
    main(project, *FAST, "--find-lr", "--find-lr-start", "1", "--out-dir", runs / "high")
    out = capsys.readouterr().out
    assert "the loss was lowest at the very start" in out and "lower --find-lr-start" in out
    # --lr auto does not train on such a guess: it says so in one line, and trains nothing.
    with pytest.raises(SystemExit) as refused:
        main(project, *FAST, "--lr", "auto", "--find-lr-start", "1", "--out-dir", runs / "auto")
    assert refused.value.code == (
        "error: --lr auto: the sweep cannot tell a learning rate (its loss was lowest at the "
        "very start), so nothing was trained: give --lr, or a lower --find-lr-start or more "
        "--find-lr-steps"
    )
    assert not (runs / "auto/last.pt").exists()


def test_eval_only_runs_no_finder(projects, capsys):
    project = projects("sgd")
    weights = project / "runs" / "weights"
    main(project, *FAST, "--epochs", "1", "--fresh", "--out-dir", weights)
    capsys.readouterr()
    flags = ["--eval-only", "--init-weights", weights / "last.pt", "--out-dir", weights.parent]
    main(project, *FAST, *flags, "--lr", "auto", "--batch-size", "auto")
    out = capsys.readouterr().out
    assert "val_acc" in out and "finder" not in out, out
    assert not (weights.parent / "lr_find.csv").exists()


BAD_FLAGS = {
    "lr": (
        ["--lr", "fast"],
        "argument --lr: must be a number > 0 or auto, got 'fast'",
    ),
    "batch size": (
        ["--batch-size", "big"],
        "argument --batch-size: must be an integer >= 1 or auto, got 'big'",
    ),
    "sweep range": (["--find-lr-end", "1e-9"], "argument --find-lr-end: must be more than"),
    "sweep of one rate": (
        ["--find-lr-start", "0.001", "--find-lr-end", "0.001"],
        "argument --find-lr-end: must be more than",
    ),
}


@pytest.mark.parametrize("flags,message", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_bad_finder_flags_are_one_line(projects, capsys, flags, message):
    with inside(projects("sgd")):
        import train

        with pytest.raises(SystemExit) as exit_info:
            train.main(flags)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


OOM_OR_NOT = {
    "cuda": (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), True),
    "cpu allocator": (RuntimeError("DefaultCPUAllocator: can't allocate memory"), True),
    "oneDNN workspace": (RuntimeError("could not create a primitive"), True),
    "aligned allocation": (RuntimeError("posix_memalign failed:Cannot allocate memory (12)"), True),
    "python": (MemoryError(), True),
    "shape mismatch": (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
}


@pytest.mark.parametrize("error,expected", OOM_OR_NOT.values(), ids=OOM_OR_NOT.keys())
def test_out_of_memory_is_told_from_other_errors(projects, error, expected):
    with inside(projects("sgd")):
        from proj.finders import is_out_of_memory

        assert is_out_of_memory(error) is expected


# Runs train.py with a real limit on the process's data memory (RLIMIT_DATA: heap and private
# writable mappings, where tensors on the CPU live; not the mapped code of the CUDA libraries
# that RLIMIT_AS would count) while it searches for the batch size. The limit is measured, not
# guessed: once a step at the reference batch has brought up what training holds (thread
# pools, allocator arenas, kernel caches), the process gets BUDGET MiB more than it then uses.
# The run ends once the batch is settled: training at the batch found, with its scaled lr, is
# what the run without a limit checks. oneDNN is off: where one of its allocations fails
# it can stay unable to create convolutions for the rest of the process (seen here about one
# run in four), which no GPU run meets; PyTorch's own kernels fail cleanly and recover.
LIMITED_RUN = """
import resource, sys
import torch
torch.backends.mkldnn.enabled = False
sys.path.insert(0, ".")
import train
from proj import finders

def data_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmData:")) >> 10

budget, flags = int(sys.argv[1]), sys.argv[2:]
search = finders.find_batch_size

def search_with_limit(model, args, data, device, reference, loss_of, cap):
    finders.trains(model, reference, args, data, device, loss_of)
    unlimited = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, ((data_mib() + budget) << 20, unlimited[1]))
    try:
        return search(model, args, data, device, reference, loss_of, cap)
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, unlimited)

def settle_then_stop(*settle_args):
    settle(*settle_args)
    sys.exit(0)  # what follows is training at the batch found, tested without a limit

finders.find_batch_size = search_with_limit
settle, train.auto_batch_size = train.auto_batch_size, settle_then_stop
train.main([*flags, "--batch-size", "auto", "--out-dir", "runs/limited"])
"""
# MiB. Measured here: 64 images of 32x32 fit in 100 MiB, 128 do not, 512 need over 400. On
# 16x16 images, 512 fitted in 150 MiB, too close to a budget for what the heap already held.
BUDGET = 100
# The ResNet, up to 512 images a batch; --lr 0.01 for batch 16. 8192 images: an epoch has 16
# optimizer steps at the cap, 512 (the finder keeps 16 an epoch). Images of 16x16 train (no
# limit), images of 32x32 meet the limit.
MEMORY = ["--model", "resnet_small", "--image-size", "16", "--synthetic-size", "8192"]
MEMORY += ["--max-batch-size", "512", "--lr", "0.01", "--epochs", "1", "--workers", "0"]
MEMORY += ["--device", "cpu", "--data-on-device", "on", "--fresh"]


def found(output: str) -> tuple[int, float]:
    """The batch size and learning rate that the batch size finder's line reports, after
    checking its linear scaling: lr = 0.01 x batch / 16."""
    match = re.search(r"batch (\d+), lr 0.01 x (\d+)/16 = (\S+)", output)
    assert match, output
    batch, lr = int(match.group(1)), float(match.group(3))
    assert int(match.group(2)) == batch and lr == pytest.approx(0.01 * batch / 16)
    return batch, lr


@pytest.mark.slow
def test_batch_size_auto_stops_at_a_real_memory_limit_and_scales_the_lr(projects, capsys):
    project = projects("sgd")  # reference batch 16
    # No limit: the search ends at the cap, and the learning rate grows with the batch.
    main(project, *MEMORY, "--batch-size", "auto", "--out-dir", project / "runs/free")
    output = capsys.readouterr().out
    assert "batch size finder: 512 fit, the most allowed" in output
    assert found(output) == (512, 0.01 * 512 / 16)
    checkpoint = torch.load(project / "runs/free/last.pt", weights_only=True)
    assert (checkpoint["args"]["batch_size"], checkpoint["args"]["lr"]) == (512, 0.01 * 512 / 16)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as this process: tests run two at a time
    result = run(PY, "-c", LIMITED_RUN, BUDGET, *MEMORY, "--image-size", "32", cwd=project, env=env)
    lines = [x for x in result.stdout.splitlines() if x.startswith("batch size finder")]
    assert len(lines) == 1, result.stdout
    line = lines[0]
    largest, failed = map(int, re.search(r"(\d+) fit, (\d+) ran out of memory", line).groups())
    batch, lr = found(line)
    assert failed == 2 * largest <= 512 and batch == largest // 2, line


def test_the_batch_size_search_samples_targets_of_every_shape(projects):
    """The search's sample stacks targets as the loader does: class indices into (N,), a
    regression's vectors into (N, k), never flattened."""
    with inside(projects("sgd")):
        from proj.finders import sample

    inputs = torch.randn(10, 4)
    for targets in (torch.arange(10), torch.randn(10, 1), torch.randn(10, 3, dtype=torch.float64)):
        items = [(x, y.item() if y.ndim == 0 else y) for x, y in zip(inputs, targets, strict=True)]
        got = sample(items, count=8)
        assert torch.equal(got[0], inputs[:8]) and torch.equal(got[1], targets[:8])
