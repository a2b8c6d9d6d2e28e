"""The rendered project's own test suite passes, for a few quite different projects."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import render, run

PROJECTS = {
    "defaults": dict(extras=["preemption"]),  # the template's own defaults
    "lamb-onecycle-fp16-finders-guard-device-data-tensorboard": dict(
        optimizer="lamb",
        scheduler="onecycle",
        amp="fp16",
        extras=["finders", "guard", "device_data", "tensorboard"],
    ),
    "ddp-lars-step-preemption-ema-speed-report": dict(
        distributed="ddp",
        optimizer="lars",
        scheduler="step",
        amp="off",
        extras=["preemption", "ema", "speed_report"],
    ),
    "fsdp-adamw-onecycle-preemption-tensorboard": dict(
        distributed="fsdp",
        optimizer="adamw",
        scheduler="onecycle",
        extras=["preemption", "tensorboard"],
    ),
}


@pytest.mark.parametrize("answers", PROJECTS.values(), ids=PROJECTS.keys())
def test_rendered_project_tests_pass(template, tmp_path, answers):
    project = render(template, tmp_path / "project", **answers)
    result = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project)
    assert " passed" in result.stdout and "failed" not in result.stdout


# The README's own data, model and loss train well whatever the optimizer and the schedule,
# and each schedule does what its tests say: the rendered tests/test_own_data.py and
# tests/test_schedule.py of projects far from the defaults in both.
OWN_DATA = {
    "constant-rmsprop": dict(scheduler="constant", optimizer="rmsprop"),
    "cyclic-adamw": dict(scheduler="cyclic", optimizer="adamw"),
    "cosine-restarts-adagrad": dict(scheduler="cosine_restarts", optimizer="adagrad"),
    "onecycle-lars-tensors": dict(
        scheduler="onecycle", optimizer="lars", data="tensors", extras=["preemption"]
    ),
}


@pytest.mark.parametrize("answers", OWN_DATA.values(), ids=OWN_DATA.keys())
def test_own_data_trains_with_any_optimizer_and_schedule(template, tmp_path, answers):
    project = render(template, tmp_path / "project", **answers)
    files = ["tests/test_own_data.py", "tests/test_schedule.py"]
    tests = ["-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    result = run(sys.executable, *tests, cwd=project)
    assert " passed" in result.stdout and "failed" not in result.stdout
