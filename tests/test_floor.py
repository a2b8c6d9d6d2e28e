"""The lowest versions the rendered projects declare are the ones `make test-floor` installs
and tests them with (tests/floor.py, which CI runs after `make test`): checked here is what
it reads from them, and that the template's own environment starts at the same floor."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.helpers import ROOT, render

spec = importlib.util.spec_from_file_location("floor", ROOT / "tests/floor.py")
floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(floor)

# What `make test-floor` found to install from this machine's disk and to pass: torchvision
# 0.28.0 (torch 2.13's) fails to import here ("operator torchvision::nms does not exist").
TESTED = {
    "images": ({"torch": "2.14.1", "torchvision": "0.29.1"}, ["tqdm>=4.60", "pytest>=7"]),
    "tensors": ({"torch": "2.13", "numpy": "1.26"}, ["tqdm>=4.60", "pytest>=7"]),
}


@pytest.mark.parametrize("data", TESTED)
def test_the_declared_floors_are_the_tested_ones(template, tmp_path, data):
    project = render(template, tmp_path / "p", data=data, extras=[])
    assert floor.requirements(project) == TESTED[data]


def test_the_template_environment_starts_at_the_image_projects_floor():
    declared = dict(
        re.findall(
            r"^(torch|torchvision)>=(\S+)$",
            (ROOT / "requirements-dev.txt").read_text(),
            re.MULTILINE,
        )
    )
    assert declared == TESTED["images"][0]


@pytest.mark.parametrize(
    ("installed", "lowest", "expected"),
    [
        ({"torch": "2.13.0+cpu"}, {"torch": "2.13"}, True),
        (
            {"torch": "2.14.1", "torchvision": "0.29.1"},
            {"torch": "2.14.1", "torchvision": "0.29.1"},
            True,
        ),
        ({"torch": "2.14.1"}, {"torch": "2.13"}, False),
        ({"torch": "2.14.1"}, {"torch": "2.14.1", "torchvision": "0.29.1"}, False),
    ],
)
def test_exactly_the_lowest_versions(installed, lowest, expected):
    assert floor.exactly(installed, lowest) is expected


def test_ci_runs_the_floor_after_the_suite():
    lines = (ROOT / ".ci/run").read_text().splitlines()
    assert lines[-2:] == ["make test", "make test-floor"]
