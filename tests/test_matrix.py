"""Every amp x optimizer x scheduler combination is rendered, linted and trained, and holds
nothing of what its answers left out.

The other questions are spread over the combinations so that each of their values is
rendered and trained at least once.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from tests.helpers import (
    AMPS,
    EXTRAS,
    OPTIMIZERS,
    SCHEDULERS,
    TINY_RUN,
    inside,
    render,
    ruff,
    train,
)

COMBINATIONS = list(itertools.product(AMPS, OPTIMIZERS, SCHEDULERS))

# Values of the other questions, cycled over the combinations (compile=True has its own test).
OTHER_ANSWERS = {
    "extras": (
        [],
        ["finders"],
        ["guard", "ema", "tensorboard"],
        list(EXTRAS),
        ["preemption", "ema", "speed_report"],
        ["device_data"],
        ["preemption", "device_data", "guard"],
    ),
    "data": ("images", "images", "tensors", "images", "tensors"),
    "workers": (0, 2, 1),
    "batch_size": (16, 128, 24, 64),  # from 64 up, with the rule of a short run
    "channels_last": (False, True),
    "label_smoothing": (0.0, 0.1),
    "epochs": (1, 2),
}

# What an answer leaves out leaves no trace: words that no rendered file may hold (Python,
# README, pyproject.toml, scripts), as regular expressions matched case-sensitively.
FORBIDDEN = {
    ("extras", "ema"): [r"\bema\b", r"\bEMA\b"],
    ("extras", "finders"): [r"find_lr", r"find-lr", r"[Ff]inder", r"lr auto", r"batch-size auto"],
    ("extras", "tensorboard"): [r"[Tt]ensor[Bb]oard", r"SummaryWriter"],
    ("extras", "preemption"): [r"SIG(TERM|USR1)", r"[Pp]reempt", r"requeue", r"save.every.minutes"],
    ("extras", "guard"): [r"[Gg]uard", r"max.bad.steps", r"nonfinite_steps", r"non_finite\b"],
    ("extras", "device_data"): [r"DeviceData", r"data.on.device", r"device_data"],
    ("extras", "speed_report"): [r"speed.report", r"[Ss]peed-ups?\b", r"SyncCounter"],
    # Your own tensors: nothing of the image machinery.
    ("data", "tensors"): [
        r"torchvision",
        r"[Cc][Ii][Ff][Aa][Rr]",
        r"MNIST",
        r"imagefolder",
        r"channels.last",
        r"hflip",
        r"resnet",
        r"SyntheticImages",
        r"image.size",
    ],
    # Images: nothing of the in-memory path of tensors.
    ("data", "images"): [r"MemoryBatches", r"\bin_memory\("],
    # Every project here is a single process: nothing of DDP's processes and ranks.
    ("distributed", "single"): [
        r"\brank",
        r"world.size",
        r"process_count",
        r"per process",
        r"several processes",
        r"processes x",
        r"distributed run",
        r"all_reduce",
        r"torchrun",
        r"\bDDP\b",
        r"DataParallel",
    ],
    # Single-process and DDP projects: nothing of FSDP's sharding.
    ("distributed", "not fsdp"): [r"FSDP", r"fully_shard", r"[Ss]harding", r"\bdcp\b", r"sharded"],
    # FSDP projects: nothing of DDP's machinery (the README compares the two), of autocast
    # (FSDP's policy casts), or of what FSDP cannot honour.
    ("distributed", "fsdp"): [
        r"DistributedDataParallel",
        r"DataParallel",
        r"no_sync",
        r"sync.bn",
        r"autocast",
        r"GradScaler",
        r"channels.last",
        r"--compile",
        r"torch\.compile",
    ],
    ("amp", "off"): [r"autocast", r"GradScaler", r"scaler", r"fp16", r"bf16", r"float16"],
    ("amp", "bf16"): [r"GradScaler", r"scaler", r"fp16", r"\bfloat16"],
}


def forbidden_words(answers: dict) -> list[str]:
    words = []
    for extra in EXTRAS:
        if extra not in answers["extras"]:
            words += FORBIDDEN[("extras", extra)]
    words += FORBIDDEN.get(("data", answers.get("data", "images")), [])
    if answers.get("distributed", "single") == "single":
        words += FORBIDDEN[("distributed", "single")]
    if answers.get("distributed", "single") == "fsdp":
        words += FORBIDDEN[("distributed", "fsdp")]
    else:
        words += FORBIDDEN[("distributed", "not fsdp")]
    return words + FORBIDDEN.get(("amp", answers["amp"]), [])


def check_nothing_left_out(project, answers: dict) -> None:
    for path in project.rglob("*"):
        if path.suffix not in (".py", ".md", ".toml", ".sh", ".sbatch") or "tests" in path.parts:
            continue
        text = path.read_text()
        for word in forbidden_words(answers):
            found = re.search(word, text)
            assert not found, f"{path.relative_to(project)} holds {found.group()!r}"


def other_answers(index: int) -> dict:
    answers = {name: values[index % len(values)] for name, values in OTHER_ANSWERS.items()}
    if answers["data"] == "tensors":  # device_data keeps image sets on the GPU: images only
        answers["extras"] = [extra for extra in answers["extras"] if extra != "device_data"]
        del answers["channels_last"]  # asked for images only
    return answers


def check_rendered(project) -> None:
    """No template syntax left, valid Python, ruff clean as rendered."""
    for path in project.rglob("*"):
        if path.is_file() and not {".git", "__pycache__"} & set(path.parts):
            text = path.read_text()
            for marker in ("{{", "{%", "{#"):
                assert marker not in text, f"{path.relative_to(project)} contains {marker!r}"
            if path.suffix == ".py":
                compile(text, str(path), "exec")
    lint = ruff("check", "--no-cache", project)
    assert lint.returncode == 0, lint.stdout
    fmt = ruff("format", "--check", "--no-cache", project)
    assert fmt.returncode == 0, fmt.stdout


@pytest.mark.parametrize(("amp", "optimizer", "scheduler"), COMBINATIONS)
def test_render_lint_and_train(template, tmp_path, amp, optimizer, scheduler):
    answers = other_answers(COMBINATIONS.index((amp, optimizer, scheduler)))
    project = render(
        template, tmp_path / "p", amp=amp, optimizer=optimizer, scheduler=scheduler, **answers
    )
    check_rendered(project)
    check_nothing_left_out(project, {"amp": amp, **answers})
    train_py = (project / "train.py").read_text()
    assert ("GradScaler" in train_py) == (amp == "fp16")
    assert ("autocast" in train_py) == (amp != "off")

    # Flags left out take the answers' defaults; --amp is forced on so the CPU runs it too.
    flags = ["--synthetic-size", "48"]
    if answers["data"] == "images":
        flags += ["--image-size", "8"]
    if COMBINATIONS.index((amp, optimizer, scheduler)) < len(OTHER_ANSWERS["workers"]):
        if "device_data" in answers["extras"]:
            flags += ["--data-on-device", "off"]  # the loader and its workers, as answered
    else:
        flags += ["--workers", "0"]  # worker processes are slow to start; a few runs suffice
    if amp != "off":
        flags += ["--amp", amp]
    layouts = []  # of each batch that reaches the model's first convolution: channels_last?
    precisions = set()  # of what the models' linear layers compute

    def watch(module, inputs, output):
        if not torch.is_grad_enabled() and len(inputs[0]) == 2 and not inputs[0].any():
            return  # model_problem's two zero inputs, before training: no batch
        if isinstance(module, torch.nn.Conv2d) and module.in_channels == 3:
            layouts.append(inputs[0].is_contiguous(memory_format=torch.channels_last))
        if isinstance(module, torch.nn.Linear):
            precisions.add(output.dtype)

    hook = torch.nn.modules.module.register_module_forward_hook(watch)
    try:
        rows = train(project, *flags)
    finally:
        hook.remove()
    # Autocast runs the forward passes, training's and evaluation's, in --amp's precision.
    assert precisions == {{"off": torch.float32, "bf16": torch.bfloat16}.get(amp, torch.float16)}
    assert [row["epoch"] for row in rows] == list(range(1, answers["epochs"] + 1))
    for row in rows:
        assert math.isfinite(row["train_loss"]) and math.isfinite(row["val_loss"])
        assert 0 <= row["val_acc"] <= 100
        assert row["samples_per_s"] > 0
    assert 0 < rows[0]["elapsed_s"] <= rows[-1]["elapsed_s"]
    assert (project / "runs/test/last.pt").is_file()
    assert (project / "runs/test/best.pt").is_file()
    extras = answers["extras"]
    assert ("ema_val_acc" in rows[0]) == ("ema" in extras)
    assert ("nonfinite_steps" in rows[0]) == ("guard" in extras)
    for extra in ("preemption", "guard", "device_data"):
        assert (project / f"proj/{extra}.py").is_file() == (extra in extras)
    assert (project / "proj/speed.py").is_file() == ("speed_report" in extras)
    assert (project / "runs/test/tensorboard").is_dir() == ("tensorboard" in extras)
    if "tensorboard" in extras:
        check_tensorboard(project / "runs/test/tensorboard", rows)
    assert (project / "proj/finders.py").is_file() == ("finders" in extras)
    assert (project / "proj/ema.py").is_file() == ("ema" in extras)
    if answers["data"] == "images":  # the answer is the default of --channels-last
        check_channels_last(project, layouts, answers["channels_last"])
    check_state_flags(project, scheduler)
    check_readme_defaults(project)


def check_readme_defaults(project) -> None:
    """The README's table of flags gives the defaults that train.py's parser has: numbers,
    on and off, and names, one per flag of its row (rows whose default the parser leaves
    to run time, None, say it in words)."""
    with inside(project):
        import train

        actions = train.get_args_parser()._option_string_actions
    readme = (project / "README.md").read_text()
    table = readme[readme.index("| flag | default |") :].split("\n\n")[0].splitlines()[2:]
    checked = []
    for row in table:
        flags_cell, default_cell = [cell.strip() for cell in row.strip("|").split("|")][:2]
        flags = re.findall(r"`(--[\w-]+)`", flags_cell)
        values = [re.sub(r" \(.*\)$", "", v).strip("`") for v in default_cell.split(", ")]
        if not default_cell or len(values) not in (1, len(flags)):
            continue
        values = values * len(flags) if len(values) == 1 else values  # --compile, --no-compile
        for flag, value in zip(flags, values, strict=True):
            default = actions[flag].default
            if default is None:
                continue
            if value in ("on", "off"):
                assert default is (value == "on"), (flag, value, default)
            elif isinstance(default, int | float) and not isinstance(default, bool):
                assert float(value) == default, (flag, value, default)
            else:
                assert value == default, (flag, value, default)
            checked.append(flag)
    assert {"--epochs", "--lr", "--weight-decay", "--workers", "--seed"} <= set(checked)


def check_channels_last(project, layouts: list[bool], channels_last: bool) -> None:
    """With channels_last the batches and the kernels are in that layout, else neither is
    (on a CPU the numbers are the same either way: the layouts are watched)."""
    assert layouts and set(layouts) == {channels_last}
    state = torch.load(project / "runs/test/last.pt", weights_only=True)
    kernels = [t for t in state["model"].values() if t.ndim == 4 and t.shape[-1] > 1]  # not 1x1
    assert kernels
    assert {t.is_contiguous(memory_format=torch.channels_last) for t in kernels} == {channels_last}


def check_tensorboard(folder, rows: list[dict]) -> None:
    """TensorBoard holds metrics.csv's numbers: a scalar per column, one value per epoch."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder)).Reload()
    columns = [name for name in rows[0] if name != "epoch"]
    assert sorted(events.Tags()["scalars"]) == sorted(columns)
    for name in columns:
        logged = [(event.step, event.value) for event in events.Scalars(name)]
        expected = [(row["epoch"], pytest.approx(row[name], rel=1e-6)) for row in rows]
        assert logged == expected, name


def check_state_flags(project, scheduler: str) -> None:
    """The flags that a resume compares with its checkpoint's (STATE_FLAGS) are --lr, every
    flag of the optimizer, and every flag of the schedule (its state holds them, or they
    shaped it)."""
    with inside(project):
        import train
        from proj.checkpoint import STATE_FLAGS

        groups = train.get_args_parser()._action_groups
    dests = {g.title.split(" (")[0]: {a.dest for a in g._group_actions} for g in groups}
    ema = {"ema_decay"} & set().union(*dests.values())  # the average the EMA holds
    assert sorted(STATE_FLAGS) == sorted(
        {"lr"} | dests["optimizer"] | dests["learning-rate schedule"] | ema
    )


def test_tiny_run_flags_are_valid(template, tmp_path):
    """The flags other tests use for a quick run are accepted by a default project."""
    rows = train(render(template, tmp_path / "p"), *TINY_RUN)
    assert len(rows) == 2
