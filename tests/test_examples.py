"""The recipes in examples/ render as answer files and train; compile=True trains too."""

from __future__ import annotations

import math
import sys

import pytest
import yaml

from tests.helpers import ROOT, TINY_RUN, inside, read_metrics, render, run

EXAMPLES = sorted((ROOT / "examples").glob("*.yml"))


def test_there_are_the_four_recipes():
    names = {path.stem for path in EXAMPLES}
    assert {
        "fast-small-images",
        "imagenet-resnet50-ddp",
        "large-batch-lamb",
        "cpu-minimal",
        "own-tensors",
    } <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_recipe_renders_and_trains(template, tmp_path, example):
    answers = yaml.safe_load(example.read_text())
    project = render(template, tmp_path / "p", **answers)
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert {k: recorded[k] for k in answers if k != "package_name"} == {
        k: v for k, v in answers.items() if k != "package_name"
    }
    # Compilation is covered below; on a CPU it would take most of a minute per recipe.
    result = run(
        sys.executable,
        "train.py",
        *TINY_RUN,
        "--epochs",
        "1",
        "--no-compile",
        "--out-dir",
        tmp_path / "out",
        cwd=project,
    )
    assert "epoch 1/1" in result.stdout
    assert math.isfinite(read_metrics(tmp_path / "out")[0]["train_loss"])


@pytest.mark.slow
def test_compiled_model_trains_and_saves_plain_weights(template, tmp_path, monkeypatch):
    """compile=True: the model goes through torch.compile (slow on the CPU) and trains, and
    checkpoints hold its plain weights, without _orig_mod."""
    import torch

    project = render(template, tmp_path / "p", compile=True, amp="off")
    compiled = []

    def spy(model, *args, **kwargs):
        compiled.append(type(model).__name__)
        return real_compile(model, *args, **kwargs)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", spy)
    flags = ["--synthetic-size", "32", "--image-size", "8", "--batch-size", "16", "--workers", "0"]
    with inside(project):
        import train

        train.main([*flags, "--epochs", "1", "--out-dir", str(tmp_path / "out")])
    assert compiled == ["ResNetSmall"]
    state = torch.load(tmp_path / "out/last.pt", weights_only=True)
    assert state["args"]["compile"] is True
    assert not any(key.startswith("_orig_mod.") for key in state["model"])
