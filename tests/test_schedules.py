"""Numerical checks of every rendered learning-rate schedule.

Each schedule is built by the rendered project's own `build_scheduler`, from arguments parsed by
its own `train.get_args_parser()`, over a one-parameter SGD, and stepped as train.py steps it:
one `scheduler.step()` after each `optimizer.step()`. `lrs[k]` is the learning rate that
optimizer step k (counted from 0) uses.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil

import pytest
import torch

from tests.helpers import SCHEDULERS, inside, read_metrics, render, train

WARMUP_SCHEDULERS = ("warmup_cosine", "cosine_restarts", "step", "constant")


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    """project(scheduler): a project rendered with that schedule (once per module and worker)."""
    rendered = {}

    def get(scheduler: str):
        if scheduler not in rendered:
            rendered[scheduler] = render(
                template,
                tmp_path_factory.mktemp(scheduler),
                amp="off",
                optimizer="sgd",
                scheduler=scheduler,
            )
        return rendered[scheduler]

    return get


def run_schedule(project, flags, steps_per_epoch, steps=None):
    """Parse `flags` with the project's parser, build its scheduler and step it `steps` times
    (default: the whole run, epochs x steps_per_epoch). Returns (args, lrs, scheduler)."""
    with inside(project):
        import train as project_train
        from proj.schedule import build_scheduler

        args = project_train.get_args_parser().parse_args(flags)
        param = torch.nn.Parameter(torch.zeros(()))
        optimizer = torch.optim.SGD([param], lr=args.lr, momentum=0.9)
        scheduler = build_scheduler(optimizer, args, args.epochs, steps_per_epoch)
        if steps is None:
            steps = args.epochs * steps_per_epoch
        lrs = []
        for _ in range(steps):
            lrs.append(optimizer.param_groups[0]["lr"])
            param.grad = torch.zeros(())
            optimizer.step()
            scheduler.step()
    return args, lrs, scheduler


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def rises(lrs: list[float], start: int) -> list[int]:
    """Steps from `start` on where the learning rate goes up."""
    return [k for k in range(max(start, 1), len(lrs)) if lrs[k] > lrs[k - 1] * (1 + 1e-12)]


def test_schedule_flags(project):
    """The flags the checks below use are the ones each schedule adds, and only those."""
    expected = {
        "warmup_cosine": {"--warmup-epochs", "--warmup-steps", "--min-lr"},
        "cosine_restarts": {
            "--warmup-epochs",
            "--warmup-steps",
            "--min-lr",
            "--restart-epochs",
            "--restart-mult",
        },
        "step": {"--warmup-epochs", "--warmup-steps", "--step-epochs", "--gamma"},
        "constant": {"--warmup-epochs", "--warmup-steps"},
        "onecycle": {"--pct-start", "--div-factor", "--final-div-factor"},
        "cyclic": {"--min-lr", "--cycle-epochs", "--cyclic-mode", "--cyclic-gamma"},
    }
    assert set(expected) == set(SCHEDULERS)
    for scheduler, flags in expected.items():
        with inside(project(scheduler)):
            from proj.schedule import add_schedule_args
            from proj.utils import ArgumentParser

            parser = ArgumentParser(add_help=False)
            add_schedule_args(parser)
        added = {s for action in parser._actions for s in action.option_strings}
        assert added == flags, scheduler


@pytest.mark.parametrize("scheduler", WARMUP_SCHEDULERS)
@pytest.mark.parametrize(
    ("warmup_flags", "warmup"),
    [(["--warmup-epochs", "1.5"], 15), (["--warmup-steps", "7"], 7)],
    ids=["epochs", "steps"],
)
def test_warmup_ends_at_the_peak_without_a_jump(project, scheduler, warmup_flags, warmup):
    flags = ["--epochs", "6", "--lr", "0.4", *warmup_flags]
    args, lrs, _ = run_schedule(project(scheduler), flags, steps_per_epoch=10)
    peak = args.lr
    # Linear from peak / warmup at the first step up to the peak at the last warmup step.
    for k in range(warmup):
        assert close(lrs[k], peak * (k + 1) / warmup), (k, lrs[:warmup])
    assert all(b > a for a, b in zip(lrs[:warmup], lrs[1:warmup], strict=False))
    assert close(lrs[warmup - 1], peak)
    assert close(lrs[warmup], peak), "the first step after warmup is not at the peak"
    # No jump where warmup ends: from three steps before it to one after, the LR moves by at
    # most one warmup increment per step (further on, a short cosine may fall faster).
    around = range(warmup - 3, warmup + 1)
    biggest = max(abs(lrs[k + 1] - lrs[k]) / peak for k in around)
    assert biggest <= 1 / warmup + 1e-9, [lrs[k] for k in around]


@pytest.mark.parametrize("scheduler", WARMUP_SCHEDULERS)
def test_no_warmup_starts_at_the_peak(project, scheduler):
    args, lrs, _ = run_schedule(
        project(scheduler), ["--epochs", "3", "--warmup-steps", "0"], steps_per_epoch=5
    )
    assert close(lrs[0], args.lr)


@pytest.mark.parametrize(("min_lr_flags", "floor"), [([], 0.5 / 100), (["--min-lr", "0.02"], 0.02)])
def test_warmup_cosine_reaches_its_floor_at_the_last_step(project, min_lr_flags, floor):
    flags = ["--epochs", "5", "--lr", "0.5", "--warmup-steps", "9", *min_lr_flags]
    args, lrs, _ = run_schedule(project("warmup_cosine"), flags, steps_per_epoch=8)
    warmup, total = 9, 40
    assert len(lrs) == total
    assert close(lrs[warmup - 1], args.lr) and close(lrs[warmup], args.lr)
    assert close(lrs[-1], floor)
    assert all(lr > floor for lr in lrs[:-1])
    decay = lrs[warmup:]
    assert all(b < a for a, b in zip(decay, decay[1:], strict=False)), "not decreasing"
    # Half-way through the decay (30 steps from the peak to the floor), half-way down.
    assert close(lrs[warmup + 15], (args.lr + floor) / 2)


@pytest.mark.parametrize(("epochs", "warmup"), [(1, 5), (2, 10), (6, 10)])
def test_the_default_warmup_is_an_epoch_at_most_half_the_schedule(project, epochs, warmup):
    """A 1-epoch run (or a 1-epoch schedule that --more-epochs restart begins) warms up over
    half of it and still decays to the floor; from 2 epochs on the warmup is one epoch."""
    args, lrs, _ = run_schedule(project("warmup_cosine"), ["--epochs", str(epochs)], 10)
    assert lrs[:warmup] == pytest.approx([args.lr * (k + 1) / warmup for k in range(warmup)])
    assert close(lrs[-1], args.lr / 100)
    assert all(b < a for a, b in zip(lrs[warmup:], lrs[warmup + 1 :], strict=False))


@pytest.mark.parametrize(
    ("mult", "restart_flags", "restarts"),
    [
        (2, ["--restart-epochs", "1"], [15, 35, 75]),  # cycles of 10, 20, 40 after 5 warmup
        (1, ["--restart-epochs", "1"], [15, 25, 35, 45, 55, 65, 75]),
        (2, [], [30]),  # by default the 75 steps after warmup are two cycles: 25 and 50
    ],
)
def test_cosine_restarts_restart_at_the_peak(project, mult, restart_flags, restarts):
    flags = ["--epochs", "8", "--warmup-steps", "5", "--restart-mult", str(mult), *restart_flags]
    args, lrs, _ = run_schedule(project("cosine_restarts"), flags, steps_per_epoch=10)
    floor = args.lr / 100
    assert len(lrs) == 80
    assert rises(lrs, start=6) == restarts
    starts = [5, *restarts]
    for begin, end in zip(starts, [*restarts, None], strict=True):
        assert close(lrs[begin], args.lr), begin
        if end is None:
            continue
        length = end - begin
        # The step before a restart is the last of its cosine, just above the floor.
        last = floor + (args.lr - floor) * 0.5 * (1 + math.cos(math.pi * (length - 1) / length))
        assert close(lrs[end - 1], last), end
        assert lrs[end - 1] < floor + 0.03 * (args.lr - floor)
    if not restart_flags:  # the run's last step is the last of the second cycle's cosine
        assert close(lrs[-1], floor + (args.lr - floor) * 0.5 * (1 + math.cos(math.pi * 49 / 50)))


@pytest.mark.parametrize(
    ("step_flags", "period", "gamma"),
    [(["--step-epochs", "2", "--gamma", "0.5"], 20, 0.5), ([], 30, 0.1)],
    ids=["explicit", "default"],
)
def test_step_decays_by_gamma_at_the_boundaries(project, step_flags, period, gamma):
    flags = ["--epochs", "9", "--warmup-steps", "5", *step_flags]
    args, lrs, _ = run_schedule(project("step"), flags, steps_per_epoch=10)
    assert len(lrs) == 90
    for k in range(5, 90):
        assert close(lrs[k], args.lr * gamma ** (k // period)), k
    for boundary in range(period, 90, period):
        assert close(lrs[boundary] / lrs[boundary - 1], gamma), boundary
    assert rises(lrs, start=6) == []


def test_a_short_step_run_decays_after_a_whole_epoch_of_warmup(project):
    """2 epochs: the default decay period, a third of the run, is at least an epoch, so the
    default warmup (an epoch) reaches the peak before the first decay."""
    args, lrs, _ = run_schedule(project("step"), ["--epochs", "2"], steps_per_epoch=10)
    expected = [args.lr * (k + 1) / 10 for k in range(10)] + [args.lr * 0.1] * 10
    assert lrs == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("scheduler", ["warmup_cosine", "step"])
def test_move_to_sets_the_rate_of_that_step(project, scheduler):
    """A run resumed at an epoch's end with other steps an epoch moves its schedule to a
    step: the optimizer's rate is then that step's, before the first step trains."""
    flags = ["--epochs", "6", "--warmup-steps", "4"]
    args, lrs, _ = run_schedule(project(scheduler), flags, steps_per_epoch=10)
    with inside(project(scheduler)):
        from proj.schedule import build_scheduler, move_to

        param = torch.nn.Parameter(torch.zeros(()))
        optimizer = torch.optim.SGD([param], lr=args.lr, momentum=0.9)
        scheduler_ = build_scheduler(optimizer, args, args.epochs, 10)
        optimizer.step()  # as restored: no warning of a schedule stepped first
        for step in (2, 25, 41):
            move_to(scheduler_, step)
            assert close(optimizer.param_groups[0]["lr"], lrs[step]), step


def test_constant_stays_at_the_peak_after_warmup(project):
    args, lrs, _ = run_schedule(
        project("constant"), ["--epochs", "4", "--warmup-epochs", "1"], steps_per_epoch=10
    )
    assert len(lrs) == 40
    assert close(lrs[9], args.lr)
    assert all(close(lr, args.lr) for lr in lrs[9:])


# Schedule flags that contradict each other or the schedule's length, each refused as the
# flags are parsed in exactly this line; and the largest value accepted beside it.
CONTRADICTIONS = {
    "cosine floor above the peak": (
        "warmup_cosine",
        ["--lr", "0.1", "--min-lr", "0.25"],
        "argument --min-lr: must be at most --lr (0.1), got 0.25",
        ["--lr", "0.1", "--min-lr", "0.1"],
    ),
    "restarts floor above the peak": (
        "cosine_restarts",
        ["--lr", "0.1", "--min-lr", "1"],
        "argument --min-lr: must be at most --lr (0.1), got 1",
        ["--lr", "0.1", "--min-lr", "0.1"],
    ),
    "cycle bottom above its top": (
        "cyclic",
        ["--lr", "0.01", "--min-lr", "0.02"],
        "argument --min-lr: must be at most --lr (0.01), got 0.02",
        ["--lr", "0.01", "--min-lr", "0.01"],
    ),
    "warmup longer than the run": (
        "constant",
        ["--epochs", "2", "--warmup-epochs", "2.5"],
        "argument --warmup-epochs: 2.5 is longer than the 2-epoch schedule: the lr would never "
        "reach --lr",
        ["--epochs", "2", "--warmup-epochs", "2"],
    ),
    "step decays after the run": (
        "step",
        ["--epochs", "3", "--step-epochs", "3"],
        "argument --step-epochs: 3 is not shorter than the 3-epoch schedule: the lr would never "
        "decay",
        ["--epochs", "3", "--step-epochs", "2.9"],
    ),
    "warmup past a step of the decay": (
        "step",
        ["--epochs", "6", "--warmup-epochs", "2.5"],
        "argument --warmup-epochs: 2.5 is longer than a step of the decay (--step-epochs 2): the "
        "lr would never reach --lr",
        ["--epochs", "6", "--warmup-epochs", "2"],
    ),
    "first cycle as long as the run": (
        "cosine_restarts",
        ["--epochs", "4", "--restart-epochs", "4"],
        "argument --restart-epochs: 4 is not shorter than the 4-epoch schedule: it would never "
        "restart",
        ["--epochs", "4", "--restart-epochs", "3.5"],
    ),
}


@pytest.mark.parametrize(
    "scheduler,flags,message,accepted", CONTRADICTIONS.values(), ids=CONTRADICTIONS.keys()
)
def test_contradictory_schedule_flags_are_one_line(
    project, capsys, scheduler, flags, message, accepted
):
    with inside(project(scheduler)):
        import train as project_train

        parser = project_train.get_args_parser()
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(flags)
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.splitlines() == [f"{parser.prog}: error: {message}"]
        parser.parse_args(accepted)


@pytest.mark.parametrize(
    ("scheduler", "epochs", "longest", "message"),
    [
        ("warmup_cosine", 2, 20, "the 20-step schedule"),
        ("cosine_restarts", 2, 20, "the 20-step schedule"),
        ("constant", 2, 20, "the 20-step schedule"),
        ("step", 3, 10, "a step of the decay (10 optimizer steps)"),
    ],
)
def test_warmup_steps_past_the_peak_are_refused_when_the_schedule_is_built(
    project, scheduler, epochs, longest, message
):
    """--warmup-steps against the schedule's length in optimizer steps (10 an epoch here),
    known once the data is: one step more than the longest warmup that reaches the peak is
    refused; that one is accepted, and its last step is at the peak."""
    flags = ["--epochs", str(epochs), "--warmup-steps"]
    with pytest.raises(Exception) as refused:
        run_schedule(project(scheduler), [*flags, str(longest + 1)], 10)
    assert type(refused.value).__name__ == "UserError"
    assert str(refused.value) == (
        f"argument --warmup-steps: {longest + 1} is longer than {message}: the lr would never "
        "reach --lr"
    )
    _, lrs, _ = run_schedule(project(scheduler), [*flags, str(longest)], 10)
    assert lrs[longest - 1] == pytest.approx(0.2)


def optimizer_steps_per_epoch(num_batches: int, accum_steps: int) -> int:
    """Count the optimizer steps of one epoch of `num_batches`, with the windows of
    train_one_epoch: full windows of `accum_steps`, the last one possibly short."""
    steps = 0
    for i in range(num_batches):
        window_start = i - i % accum_steps
        window = min(accum_steps, num_batches - window_start)
        if i + 1 - window_start == window:
            steps += 1
    return steps


@pytest.mark.parametrize(
    ("num_batches", "accum_steps", "expected"), [(10, 3, 4), (10, 1, 10), (9, 3, 3), (2, 5, 1)]
)
def test_steps_per_epoch_counts_the_short_last_window(num_batches, accum_steps, expected):
    assert math.ceil(num_batches / accum_steps) == expected  # train.py's steps_per_epoch
    assert optimizer_steps_per_epoch(num_batches, accum_steps) == expected


@pytest.mark.parametrize(
    ("extra", "pct_start", "div_factor", "final_div_factor"),
    [
        ([], 0.25, 25.0, 1e4),
        (["--pct-start", "0.5", "--div-factor", "10", "--final-div-factor", "100"], 0.5, 10, 100),
    ],
    ids=["default", "explicit"],
)
def test_onecycle(project, extra, pct_start, div_factor, final_div_factor):
    num_batches, accum_steps, epochs = 10, 3, 5
    steps_per_epoch = math.ceil(num_batches / accum_steps)  # as train.py computes it
    total = epochs * optimizer_steps_per_epoch(num_batches, accum_steps)
    assert total == 20
    flags = ["--epochs", str(epochs), "--lr", "0.3", "--accum-steps", str(accum_steps), *extra]
    args, lrs, scheduler = run_schedule(project("onecycle"), flags, steps_per_epoch)
    assert scheduler.total_steps == total
    assert len(lrs) == total and scheduler.last_epoch == total  # stepped exactly `total` times
    peak_step = round(pct_start * total) - 1
    assert close(lrs[peak_step], args.lr)
    assert max(lrs) == lrs[peak_step]
    assert close(lrs[0], args.lr / div_factor)
    assert close(lrs[-1], args.lr / div_factor / final_div_factor)
    assert all(b > a for a, b in zip(lrs[: peak_step + 1], lrs[1 : peak_step + 1], strict=False))
    after = lrs[peak_step:]
    assert all(b < a for a, b in zip(after, after[1:], strict=False))
    # Exactly `total`: one step more is past the end of the cycle, which OneCycleLR refuses.
    with pytest.raises(ValueError, match="total steps"):
        scheduler.step()


@pytest.mark.parametrize("steps", [3, 4, 6, 7])
def test_a_short_onecycle_rises_over_two_steps_and_still_ends_at_its_end(project, steps):
    """A run of fewer steps than --pct-start needs for a rise of two (8 at 0.25) rises over
    two steps, not padded to 8: its last step is at the cycle's final rate, not part-way."""
    args, lrs, scheduler = run_schedule(project("onecycle"), ["--epochs", "1"], steps)
    assert scheduler.total_steps == len(lrs) == steps
    assert close(lrs[0], args.lr / 25) and close(lrs[1], args.lr) and max(lrs) == lrs[1]
    assert close(lrs[-1], args.lr / 25 / 1e4)


@pytest.mark.parametrize("value", ["0", "1", "1.5"])
def test_onecycle_pct_start_leaves_room_for_both_phases(project, value, capsys):
    """0 would leave no rise and 1 no descent (OneCycleLR divides by that length at its last
    step): one line before anything runs."""
    with inside(project("onecycle")):
        import train as project_train

        with pytest.raises(SystemExit):
            project_train.get_args_parser().parse_args(["--pct-start", value])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"argument --pct-start: must be a number > 0 and < 1, got '{value}'")


@pytest.mark.parametrize(
    ("mode_flags", "bottom", "height_per_cycle"),
    [
        ([], 0.6 / 10, lambda cycle: 1.0),
        (["--min-lr", "0.05"], 0.05, lambda cycle: 1.0),
        (["--cyclic-mode", "triangular2"], 0.06, lambda cycle: 0.5**cycle),
    ],
    ids=["triangular", "min-lr", "triangular2"],
)
def test_cyclic(project, mode_flags, bottom, height_per_cycle):
    flags = ["--epochs", "6", "--lr", "0.6", "--cycle-epochs", "2", *mode_flags]
    args, lrs, _ = run_schedule(project("cyclic"), flags, steps_per_epoch=10)
    half = 10  # cycle-epochs 2 x 10 steps per epoch / 2
    assert len(lrs) == 60
    for cycle in range(3):
        start = 2 * half * cycle
        top = bottom + (args.lr - bottom) * height_per_cycle(cycle)
        assert close(lrs[start], bottom), start
        assert close(lrs[start + half], top), start + half
        assert close(lrs[start + half // 2], (bottom + top) / 2), start + half // 2
        up = lrs[start : start + half + 1]
        down = lrs[start + half : start + 2 * half + 1] if cycle < 2 else lrs[start + half :]
        assert all(b > a for a, b in zip(up, up[1:], strict=False))
        assert all(b < a for a, b in zip(down, down[1:], strict=False))
    assert min(lrs) == pytest.approx(bottom) and max(lrs) == pytest.approx(args.lr)


def test_cyclic_exp_range_decays_the_height(project):
    flags = ["--epochs", "4", "--lr", "0.6", "--cyclic-mode", "exp_range", "--cyclic-gamma", "0.9"]
    args, lrs, _ = run_schedule(project("cyclic"), [*flags, "--cycle-epochs", "2"], 10)
    bottom = args.lr / 10
    for top_step in (10, 30):
        assert close(lrs[top_step], bottom + (args.lr - bottom) * 0.9**top_step)


@pytest.mark.parametrize(("epochs", "cycles"), [(1, 1), (2, 1), (3, 2), (4, 2), (7, 4)])
def test_cyclic_by_default_ends_the_run_at_the_bottom_of_a_whole_cycle(project, epochs, cycles):
    """Without --cycle-epochs the run is a whole number of cycles of about 2 epochs (3 epochs:
    2 cycles of 1.5), so that its last step is at the bottom, not part-way up a cycle."""
    args, lrs, _ = run_schedule(project("cyclic"), ["--epochs", str(epochs)], 10)
    bottom, steps = args.lr / 10, 10 * epochs
    assert len(lrs) == steps and close(lrs[0], bottom) and close(lrs[-1], bottom)
    assert steps < 10 * cycles or close(max(lrs), args.lr)  # the first top is on a step
    half = (steps - 1) / (2 * cycles)  # steps from a bottom to the next top
    peaks = [k for k in range(1, steps - 1) if lrs[k - 1] < lrs[k] >= lrs[k + 1]]
    assert len(peaks) == cycles
    for cycle, peak in enumerate(peaks):  # each top is within a step of where it should be
        assert abs(peak - (2 * cycle + 1) * half) < 1, (peak, half)


def test_a_resume_that_stops_before_the_schedules_end_says_so(project, tmp_path, capsys):
    """A 4-epoch cosine stopped in epoch 2 and resumed with --epochs 2 stops at a rate far
    above the floor: the schedule keeps its span. The resume says so in a line."""
    proj = project("warmup_cosine")
    with inside(proj):
        import train as project_train

        from tests.test_resume import stop_at_step

        stop_at_step(project_train, [*MORE, "--epochs", "4", "--out-dir", str(tmp_path)], 15)
    capsys.readouterr()
    lrs = lrs_by_step(proj, tmp_path, "--epochs", "2")
    assert len(lrs) == 5 and lrs[-1] > 0.5 / 2  # epoch 2's last 5 steps, high on the cosine
    said = "note: the schedule ends at epoch 4; --epochs 2 stops short\n"
    assert capsys.readouterr().out.count(said) == 1
    lrs_by_step(proj, tmp_path, "--epochs", "4")  # the whole schedule: nothing to say
    assert "note: the schedule" not in capsys.readouterr().out


def test_cyclic_resumed_with_other_steps_per_epoch_is_refused(project, tmp_path):
    """CyclicLR keeps its cycle's length in optimizer steps in the state a resume loads: a
    run resumed at an epoch's end with another batch would go on with the old cycles, out of
    step with its epochs. It is refused, naming both lengths; the same batch goes on."""
    proj = project("cyclic")
    lrs_by_step(proj, tmp_path, "--epochs", "1")  # 10 steps: one cycle, 4.5 up and 4.5 down
    with pytest.raises(
        Exception,
        match="its cycles span 9 optimizer steps, this run's would "
        "span 4: resume with the --batch-size and --accum-steps it was made with",
    ) as refused:
        lrs_by_step(proj, tmp_path, "--epochs", "2", "--batch-size", "32")
    assert type(refused.value).__name__ == "CheckpointError"
    # Saved part-way through an epoch, it asks for the same batch, with no word of an epoch's
    # end taking any (cyclic's does not).
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    state["progress"].update(epoch=0, batch=3, step=3)
    torch.save(state, tmp_path / "part-way.pt")
    part_way = ["--epochs", "1", "--batch-size", "32", "--resume", str(tmp_path / "part-way.pt")]
    with pytest.raises(Exception) as refused:
        lrs_by_step(proj, tmp_path / "p", *part_way)
    assert str(refused.value).endswith("finish that epoch with --batch-size 16 --accum-steps 1")
    assert len(lrs_by_step(proj, tmp_path, "--epochs", "2")) == 10


def test_onecycle_train_py_steps_exactly_the_total_with_accumulation(project):
    """The real train.py: 176 images in batches of 8 are 22 batches, which accumulation over 3
    makes 8 optimizer steps per epoch (7 full windows and a short one of 1); 2 epochs, 16 steps.
    OneCycleLR raises on a step past its total, and too large a total would end the run before
    its final LR: the checkpoint shows the two agree."""
    proj = project("onecycle")
    flags = ["--synthetic-size", "176", "--batch-size", "8", "--epochs", "2", "--workers", "0"]
    flags += ["--accum-steps", "3", "--model", "mlp", "--device", "cpu", "--fresh"]
    rows = train(proj, *flags)
    assert [row["epoch"] for row in rows] == [1, 2]
    checkpoint = torch.load(proj / "runs" / "test" / "last.pt", weights_only=True)
    assert checkpoint["progress"]["step"] == 16
    assert checkpoint["scheduler"]["total_steps"] == 16
    assert checkpoint["scheduler"]["last_epoch"] == 16


@pytest.mark.parametrize(("scheduler", "default"), [("onecycle", 0.95), ("cyclic", 0.9)])
@pytest.mark.parametrize("given", [None, 0.5, 0.05, 0.0])
def test_cycled_momentum_runs_from_the_flag_to_a_tenth_below(project, scheduler, default, given):
    """1cycle and the cyclical schedule cycle the momentum against the learning rate, from
    --momentum (the top; by default torch's 0.95 for 1cycle, 0.9 for CyclicLR) to 0.1 lower
    (at least 0); --momentum 0 is no momentum at all."""
    with inside(project(scheduler)):
        import train as project_train
        from proj.schedule import build_scheduler

        parser = project_train.get_args_parser()
        flags = ["--epochs", "4"] + ([] if given is None else ["--momentum", str(given)])
        flags += ["--cycle-epochs", "2"] if scheduler == "cyclic" else []  # steps on its ends
        args = parser.parse_args(flags)
        param = torch.nn.Parameter(torch.zeros(()))
        optimizer = torch.optim.SGD([param], lr=args.lr, momentum=args.momentum)
        scheduler_ = build_scheduler(optimizer, args, args.epochs, steps_per_epoch=10)
        momenta = []
        for _ in range(40):
            momenta.append(optimizer.param_groups[0]["momentum"])
            param.grad = torch.zeros(())
            optimizer.step()
            scheduler_.step()
        help_text = next(a.help for a in parser._actions if "--momentum" in a.option_strings)
    top = default if given is None else given
    assert max(momenta) == pytest.approx(top)
    assert min(momenta) == pytest.approx(max(0.0, top - 0.1), abs=1e-3)
    assert "0.1 lower and back" in help_text


# 160 images in batches of 16: 10 optimizer steps an epoch; no warmup, so lr starts at 0.5.
MORE = ["--synthetic-size", "160", "--batch-size", "16", "--workers", "0", "--model", "mlp"]
MORE += ["--device", "cpu", "--lr", "0.5", "--log-interval", "1"]


def lrs_by_step(project, out, *flags) -> list[float]:
    """Train, logging the learning rate the schedule set after each optimizer step."""
    with inside(project):
        import train as project_train

        lrs = []
        real = project_train.train_step

        def logged(parts, *args):
            loss = real(parts, *args)
            lrs.append(parts.optimizer.param_groups[0]["lr"])
            return loss

        project_train.train_step = logged
        project_train.main([*MORE, *flags, "--out-dir", str(out)])
    return lrs


@pytest.mark.parametrize("scheduler", ["onecycle", "cosine_restarts"])
def test_metrics_log_the_rate_of_each_epochs_last_step(project, scheduler, tmp_path):
    """metrics.csv's lr is the rate the epoch's last optimizer step used: for OneCycle the end
    of its anneal (not the rate one step past it), for restarts the cycle's floor (not the
    next cycle's peak)."""
    restarts = ["--warmup-steps", "0", "--restart-epochs", "1", "--restart-mult", "1"]
    flags = ["--epochs", "3"] + (restarts if scheduler != "onecycle" else [])
    used = []
    with inside(project(scheduler)):
        import train as project_train

        real = project_train.train_step

        def recorded(parts, *args):
            used.append(parts.optimizer.param_groups[0]["lr"])
            return real(parts, *args)

        project_train.train_step = recorded
        project_train.main([*MORE, *flags, "--out-dir", str(tmp_path)])
    assert len(used) == 30
    logged = [row["lr"] for row in read_metrics(tmp_path)]
    assert logged == used[9::10]
    if scheduler == "onecycle":  # the end of the anneal: lr / div_factor / final_div_factor
        assert logged[-1] == pytest.approx(min(used)) and logged[-1] < 1e-4
    else:  # each cycle's last step is 9/10 of the way down its cosine to lr / 100
        floor = 0.005
        end = floor + (0.5 - floor) * (1 + math.cos(math.pi * 9 / 10)) / 2
        assert logged == pytest.approx([end] * 3)


def test_more_epochs_continue_the_schedule_or_restart_it(project, tmp_path):
    """A finished 2-epoch cosine resumed with --epochs 4: by default it stays at its floor
    (the cosine does not stretch, so the learning rate does not jump back up); with
    --more-epochs restart a new cosine runs over the 2 epochs added, from the peak to the
    floor again. A restart part-way through an epoch is refused in one line."""
    proj = project("warmup_cosine")
    flags = ["--warmup-steps", "0"]
    first = lrs_by_step(proj, tmp_path / "a", *flags, "--epochs", "2")
    assert first[-1] == pytest.approx(0.005)  # lr / 100
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    more = lrs_by_step(proj, tmp_path / "a", *flags, "--epochs", "4")
    assert more == pytest.approx([0.005] * 20)
    restarted = lrs_by_step(
        proj, tmp_path / "b", *flags, "--epochs", "4", "--more-epochs", "restart"
    )
    assert restarted == pytest.approx(first)  # the same cosine, over the epochs added
    assert len(restarted) == 20
    state = torch.load(tmp_path / "b/last.pt", weights_only=True)
    assert (state["progress"]["schedule_start"], state["progress"]["schedule_epochs"]) == (2, 2)
    again = lrs_by_step(proj, tmp_path / "b", *flags, "--epochs", "5")  # goes on from there
    assert again == pytest.approx([0.005] * 10)
    # metrics.csv logs the learning rate of each epoch's last step (10 steps an epoch): the
    # rate that the schedule left after the step before it.
    assert [row["lr"] for row in read_metrics(tmp_path / "a")] == first[8::10] + more[8::10]
    logged = [row["lr"] for row in read_metrics(tmp_path / "b")]
    assert logged == first[8::10] + restarted[8::10] + again[8::10]
    state["progress"].update(batch=3)
    torch.save(state, tmp_path / "part-way.pt")
    refused = "part-way through epoch 5; finish it with --epochs 4 first"
    with pytest.raises(Exception, match=refused) as error:
        restart = ["--epochs", "6", "--more-epochs", "restart"]
        lrs_by_step(proj, tmp_path / "c", "--resume", str(tmp_path / "part-way.pt"), *restart)
    assert type(error.value).__name__ == "CheckpointError"  # train.py prints it in one line


def test_a_restarted_schedule_resumed_with_the_same_command_goes_on(project):
    """A run restarted with --more-epochs restart and stopped at an epoch's end (preempted,
    say) and requeued with the same command goes on with that schedule, not a third one;
    --epochs past its end starts another."""
    with inside(project("warmup_cosine")):
        import train as project_train
        from proj.checkpoint import schedule_span

        def span(epochs: int) -> tuple[int, int]:
            flags = ["--epochs", str(epochs), "--more-epochs", "restart"]
            args = project_train.get_args_parser().parse_args(flags)
            saved = {"schedule_start": 2, "schedule_epochs": 2, "epoch": 3, "batch": 0}
            return schedule_span({"progress": saved, "args": {"epochs": 2}}, args)

        assert [span(3), span(4), span(6)] == [(2, 2), (2, 2), (3, 3)]


def test_1cycle_cannot_continue_past_its_end_and_restarts(project, tmp_path):
    proj = project("onecycle")
    first = lrs_by_step(proj, tmp_path / "a", "--epochs", "2")
    with pytest.raises(Exception, match="1cycle cannot go on past its end at epoch 2: ") as error:
        lrs_by_step(proj, tmp_path / "a", "--epochs", "3")
    assert type(error.value).__name__ == "CheckpointError"
    assert str(error.value).endswith(
        "--more-epochs restart starts a new cycle over the epochs added"
    )
    restarted = lrs_by_step(proj, tmp_path / "a", "--epochs", "4", "--more-epochs", "restart")
    assert restarted == pytest.approx(first)


# The hint of a learning rate far off (schedule.py's LrHint): 640 images of 8x8 in batches of
# 16 train the MLP 40 steps an epoch; SGD's default lr is 0.2.
HINT_RUN = ["--synthetic-size", "640", "--image-size", "8", "--model", "mlp"]
HINT_RUN += ["--batch-size", "16", "--workers", "0", "--device", "cpu"]
HINT = r"--lr (\S+) looks too (low|high): the training loss went from (\S+) to (\S+) in the "
HINT += r"first 40 steps; try --lr (\S+)"


@pytest.fixture(scope="module")
def without_finders(template, tmp_path_factory):
    """The project of `project("warmup_cosine")`, without the finders extra."""
    return render(template, tmp_path_factory.mktemp("plain"), amp="off", optimizer="sgd", extras=[])


def test_a_floor_at_the_peak_is_accepted_with_or_without_finders(project, without_finders):
    """--min-lr equal to --lr: a constant rate after warmup, the edge of what is refused."""
    for proj in (project("warmup_cosine"), without_finders):
        flags = ["--lr", "0.1", "--min-lr", "0.1", "--epochs", "2", "--warmup-steps", "0"]
        args, lrs, _ = run_schedule(proj, flags, steps_per_epoch=5)
        assert lrs == pytest.approx([0.1] * 10, rel=1e-12)


def hints(proj, out, capsys, *flags: str) -> list[tuple]:
    """Train; the hint lines printed, each as (lr, word, first, last, flag)."""
    capsys.readouterr()
    train(proj, *HINT_RUN, "--out-dir", str(out), *flags)
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if " looks too " in line]
    assert all(re.fullmatch(HINT, line) for line in said), said
    if said:  # right after the epoch line of the epoch where it was read
        assert lines[lines.index(said[0]) - 1].startswith("epoch 1/")
    return [re.fullmatch(HINT, line).groups() for line in said]


@pytest.mark.parametrize("finders", [True, False], ids=["finders", "no-finders"])
def test_a_learning_rate_far_off_is_named_once_with_the_flag_to_try(
    project, without_finders, tmp_path, capsys, monkeypatch, finders
):
    proj = project("warmup_cosine") if finders else without_finders
    # The default lr says nothing, on the built-in images (and over a second epoch).
    assert hints(proj, tmp_path / "default", capsys, "--epochs", "2") == []
    # 1000x too low: the loss hardly moves. Said once, after the first epoch only.
    [(lr, word, first, last, flag)] = hints(
        proj, tmp_path / "low", capsys, "--lr", "0.0002", "--epochs", "2"
    )
    assert (lr, word, flag) == ("0.0002", "low", "auto" if finders else "0.002")
    assert 0.98 * float(first) < float(last) < float(first)
    # Fine-tuning from those weights at the same rate: a loss near its floor is no sign of the
    # lr, and the hint was measured from scratch: nothing said.
    init = ["--init-weights", str(tmp_path / "low/last.pt")]
    assert hints(proj, tmp_path / "tuned", capsys, *init, "--lr", "0.0002", "--epochs", "1") == []
    # 100x too high: the loss explodes (clipped at norm 1, as the run clips).
    [(lr, word, first, last, flag)] = hints(
        proj, tmp_path / "high", capsys, "--lr", "20", "--epochs", "1"
    )
    assert (lr, word, flag) == ("20", "high", "auto" if finders else "2")
    assert float(last) > 1.5 * float(first)
    # Not finite: the run says so itself, and the hint says nothing more.
    nan = ["--lr", "100", "--clip-grad", "0", "--epochs", "1"]
    if finders:  # with the guard (RUNTIME_EXTRAS) and no limit: it skips and counts them
        assert hints(proj, tmp_path / "nan", capsys, *nan, "--max-bad-steps", "0") == []
        assert read_metrics(tmp_path / "nan")[0]["nonfinite_steps"] > 0
    else:  # the run stops
        with pytest.raises(SystemExit):
            hints(proj, tmp_path / "nan", capsys, *nan)
        out, err = capsys.readouterr()
        assert "the weights are no longer finite" in err and " looks too " not in out
    # A run resumed past the first epoch does not read it again.
    with inside(proj):
        import train as project_train
        from proj.schedule import LrHint

        read = []
        monkeypatch.setattr(LrHint, "line", lambda self, *args: read.append(args) or "")
        flags = [*HINT_RUN, "--lr", "0.0002", "--epochs", "3", "--out-dir", str(tmp_path / "low")]
        project_train.main(flags)
    assert read == []
    assert " looks too " not in capsys.readouterr().out
    assert len(read_metrics(tmp_path / "low")) == 3


def test_a_resume_with_other_batches_goes_on_from_the_same_epoch_of_the_schedule(
    without_finders, tmp_path
):
    """The schedule counts optimizer steps. A checkpoint from an epoch's end resumed with
    another --batch-size (so other steps an epoch; so also --accum-steps and processes) goes
    on from the same epoch of it, in this run's steps: the learning rates of the epochs after
    are those of a run made at the new batch throughout."""
    flags = ["--synthetic-size", "160", "--image-size", "8", "--model", "mlp", "--workers", "0"]
    train(
        without_finders,
        *flags,
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--out-dir",
        str(tmp_path / "a"),
    )
    state = torch.load(tmp_path / "a/last.pt", weights_only=True)
    state["progress"]["schedule_epochs"] = state["args"]["epochs"] = 3  # stopped after 1 of 3
    torch.save(state, tmp_path / "a.pt")
    at_8 = [*flags, "--batch-size", "8", "--epochs", "3"]
    resumed = train(
        without_finders, *at_8, "--resume", str(tmp_path / "a.pt"), "--out-dir", str(tmp_path / "b")
    )
    whole = train(without_finders, *at_8, "--out-dir", str(tmp_path / "c"))
    assert [row["lr"] for row in resumed[1:]] == [row["lr"] for row in whole[1:]]
    assert whole[1]["lr"] != whole[2]["lr"]


# The batch of a short run (data.py's short_run_batch): with --batch-size not given, the
# answer's batch is halved, down to the larger of 32 and a quarter of it, while --epochs would
# take fewer than 200 optimizer steps. Optimizer steps of 1500 items: at 128, 11 batches an
# epoch; at 64, 23; at 32, 46.
@pytest.mark.parametrize(
    ("answer", "items", "epochs", "accum_steps", "expected"),
    [
        (128, 1500, 19, 1, 128),  # 19 x 11 = 209 steps
        (128, 1500, 18, 1, 64),  # 18 x 11 = 198; 18 x 23 = 414
        (128, 1500, 9, 1, 64),  # 9 x 23 = 207
        (128, 1500, 8, 1, 32),  # 8 x 23 = 184; 8 x 46 = 368
        (128, 1500, 1, 1, 32),  # a quarter of 128 at the least: 46 steps
        (128, 1500, 5, 2, 32),  # windows of 2: 5 x 6 = 30, 5 x 12 = 60, 5 x 23 = 115
        (128, 1500, 34, 2, 128),  # 11 batches make 6 windows (the last is short): 34 x 6 = 204
        (128, 1500, 33, 2, 64),  # 33 x 6 = 198; 33 x 12 = 396
        (128, 200_000, 1, 1, 128),  # 1562 steps
        (64, 1500, 1, 1, 32),  # 32 at the least, not a quarter of 64
        (512, 1500, 1, 1, 128),  # a quarter of 512 at the least
        (128, 100, 5, 1, 32),  # no batch of 128 in 100 items, 3 of 32
        (128, 20, 5, 1, 128),  # none of 32 either: train.py's check names the batch that fits
    ],
)
def test_a_short_run_halves_the_default_batch(
    without_finders, answer, items, epochs, accum_steps, expected, capsys, monkeypatch
):
    with inside(without_finders):
        from proj import data

        monkeypatch.setattr(data, "BATCH_SIZE", answer)
        args = argparse.Namespace(epochs=epochs, accum_steps=accum_steps)
        assert data.short_run_batch(items, args) == expected
    said = capsys.readouterr().out
    if expected == answer:
        assert said == ""
    else:
        steps = epochs * math.ceil(items // answer / accum_steps)
        keep = f"; --batch-size {answer} keeps {answer}" if steps else ""  # none to keep
        assert said == (
            f"batch {expected}, not {answer}: {epochs} epoch{'s' * (epochs > 1)} of {items} "
            f"items are {steps} "
            f"optimizer steps at {answer}, {epochs * math.ceil(items // expected / accum_steps)} "
            f"at {expected}{keep}\n"
        )


def test_a_short_run_trains_at_the_smaller_batch_and_its_resume_keeps_it(
    without_finders, tmp_path, capsys
):
    """5 epochs of 1500 items: batch 32 (230 steps). Resumed to 19 epochs, where a new run
    would take 128, the run goes on at 32: 19 x 46 steps in all."""
    flags = ["--synthetic-size", "1500", "--image-size", "8", "--model", "mlp", "--workers", "0"]
    train(without_finders, *flags, "--epochs", "5", "--out-dir", str(tmp_path))
    said = capsys.readouterr().out
    assert "batch 32, not 128: 5 epochs of 1500 items are 55 optimizer steps" in said
    state = torch.load(tmp_path / "last.pt", map_location="cpu", weights_only=True)
    assert (state["args"]["batch_size"], state["progress"]["step"]) == (32, 5 * 46)
    train(without_finders, *flags, "--epochs", "19", "--out-dir", str(tmp_path))
    state = torch.load(tmp_path / "last.pt", map_location="cpu", weights_only=True)
    assert (state["args"]["batch_size"], state["progress"]["step"]) == (32, 19 * 46)
    assert "not 128" not in capsys.readouterr().out
    # An evaluation takes no steps: its batch is the answer's, with nothing said of steps.
    weights = ["--init-weights", str(tmp_path / "last.pt"), "--out-dir", str(tmp_path / "e")]
    with inside(without_finders):
        import train as project_train

        project_train.main([*flags, "--eval-only", *weights])
    said = capsys.readouterr().out
    assert "steps" not in said and said.startswith("val_loss "), said


def test_the_hint_after_lr_auto_names_a_rate_not_the_sweep(project):
    """A run whose lr --lr auto chose is told a rate to try (a tenth of it, here), not
    --lr auto again; a run given its lr is told to try the sweep."""
    with inside(project("warmup_cosine")):
        from proj.schedule import HINT_STEPS, LrHint

    for swept, flag in ((False, "auto"), (True, "0.2")):
        hint = LrHint(True, swept)
        for loss in [1.0] * HINT_STEPS + [2.0] * HINT_STEPS:  # it doubled: too high
            hint.add(torch.tensor(loss))
        assert hint.line(2 * HINT_STEPS, 1.5, 2.0) == (
            f"--lr 2 looks too high: the training loss went from 1 to 2 in the first "
            f"{2 * HINT_STEPS} steps; try --lr {flag}"
        )
