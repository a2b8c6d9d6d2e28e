"""The user's data mistakes end in one line naming the data set or the file, before training
where the sample of items that check_info looks at shows them: targets the default loss
cannot take, an empty set, items of another shape, inputs that are not finite. Outside the
sample, the loader's batches are checked as they are made. Image folders that link back
into themselves are walked once, and an image that cannot be read is named. Both answers to
`data` (images, and tensors of your own) get the same checks."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import runpy
import signal
import sys

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from tests.helpers import TINY_RUN, inside, render

SET = "data set 'synthetic'"
CLASSES = (
    "where the default cross-entropy takes class indices: int64 from 0 to 9 "
    "(DataInfo.num_classes is 10)"
)
# Each mode's input shape in the tiny runs, and that of an input one sample shorter.
SHAPES = {"images": ("(3, 8, 8)", "(3, 8, 7)"), "tensors": ("(1, 64)", "(1, 63)")}
FLAGS = {"images": ["--image-size", "8", "--model", "mlp"], "tensors": []}


@pytest.fixture(scope="module")
def projects(template, tmp_path_factory):
    """The images project with the guard against non-finite losses, and a tensors project
    with no extras (as examples/cpu-minimal.yml has), where a checkpoint meets the NaN."""
    root = tmp_path_factory.mktemp("data-mistakes")
    return {
        "images": render(template, root / "images", extras=["guard"]),
        "tensors": render(template, root / "tensors", data="tensors", extras=[]),
    }


def refusal(project, capsys, *flags, change=None, lengths=None, sample=None, classes=None):
    """Run train.py as a script in this process on its built-in synthetic set made hostile:
    each item passed through change(index, split, input, target), a split's length made
    lengths[split], DataInfo.num_classes made `classes`, check_info's sample cut to `sample`
    items. The run must stop: returns its exit status and what it said on stderr."""
    with inside(project):
        from proj import data

        name = "SyntheticImages" if hasattr(data, "SyntheticImages") else "SyntheticSignals"
        built_in, info = getattr(data, name), data.DataInfo

        class Hostile(built_in):
            def __init__(self, *args, split="train", **kwargs):
                super().__init__(*args, split=split, **kwargs)
                self.split = split

            def __len__(self):
                return (lengths or {}).get(self.split, super().__len__())

            def __getitem__(self, index):
                inputs, target = super().__getitem__(index)
                return change(index, self.split, inputs, target) if change else (inputs, target)

        setattr(data, name, Hostile)  # the module is forgotten when `inside` ends
        if classes:
            data.DataInfo = lambda *a, **k: dataclasses.replace(info(*a, **k), num_classes=classes)
        if sample:
            data.SAMPLE = sample
        sys.argv = ["train.py", *TINY_RUN, *flags]
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path("train.py", run_name="__main__")
    code, err = exit_info.value.code, capsys.readouterr().err.strip().splitlines()
    if isinstance(code, str):  # sys.exit(message): Python prints it and exits 1
        return 1, [code, *err]
    return code, err


def target(value):
    return lambda i, split, inputs, label: (inputs, value(i, split, label))


# name: (change, other arguments of `refusal`, the one line expected for it)
BEFORE_TRAINING = {
    "label -1": (
        target(lambda i, split, label: -1 if i == 3 else label),
        {},
        f"error: {SET}, training item 3: target -1, {CLASSES}",
    ),
    "label num_classes in the validation set": (
        target(lambda i, split, label: 10 if split == "val" and i == 2 else label),
        {},
        f"error: {SET}, validation item 2: target 10, {CLASSES}",
    ),
    "float labels": (
        target(lambda i, split, label: float(label)),
        {},
        f"error: {SET}, training item 0: targets of type float64 and shape (), {CLASSES}",
    ),
    "one-hot labels": (
        target(lambda i, split, label: F.one_hot(torch.as_tensor(label), 10)),
        {},
        f"error: {SET}, training item 0: targets of type int64 and shape (10,), {CLASSES}",
    ),
    "int32 labels": (
        target(lambda i, split, label: torch.tensor(int(label), dtype=torch.int32)),
        {},
        f"error: {SET}, training item 0: targets of type int32 and shape (), {CLASSES}",
    ),
    "string labels": (
        target(lambda i, split, label: str(int(label))),
        {},
        f"error: {SET}, training item 0: targets of type str, {CLASSES}",
    ),
    "no labels": (
        lambda i, split, inputs, label: inputs,
        {},
        f"error: {SET}, training item 0: items that do not make a batch of (input, target) "
        "pairs (not enough values to unpack (expected 2, got 1))",
    ),
    "declared classes fewer than the labels": (
        None,
        {"classes": 3},
        # The first item in the sample whose class is past 2.
        re.compile(
            rf"error: {SET}, training item \d+: target [3-9], where the default cross-entropy "
            r"takes class indices: int64 from 0 to 2 \(DataInfo.num_classes is 3\)"
        ),
    ),
    "an empty training set": (
        None,
        {"lengths": {"train": 0}},
        f"error: {SET}: its training set is empty",
    ),
    "an empty validation set": (
        None,
        {"lengths": {"val": 0}},
        f"error: {SET}: its validation set is empty",
    ),
    "an item of another shape": (
        lambda i, split, inputs, label: (inputs[..., :-1] if i == 1 else inputs, label),
        {},
        "error: {SET}, training item 1: inputs of shape {short}, its DataInfo says {shape}",
    ),
    "NaN inputs": (
        lambda i, split, inputs, label: (inputs.float() * (math.nan if i % 2 else 1), label),
        {},
        f"error: {SET}, training item 1: NaN or inf in its input",
    ),
}


@pytest.mark.parametrize("mode", ["images", "tensors"])
@pytest.mark.parametrize("case", BEFORE_TRAINING, ids=str)
def test_data_mistakes_are_one_line_before_training(projects, capsys, tmp_path, mode, case):
    change, options, expected = BEFORE_TRAINING[case]
    flags = [*FLAGS[mode], "--out-dir", str(tmp_path)]
    status, lines = refusal(projects[mode], capsys, *flags, change=change, **options)
    assert status == 1 and len(lines) == 1, lines
    if isinstance(expected, re.Pattern):
        assert expected.fullmatch(lines[0]), lines
    else:
        shape, short = SHAPES[mode]
        assert lines[0] == expected.format(SET=SET, shape=shape, short=short)
    assert not (tmp_path / "metrics.csv").exists()  # no training started


OUTSIDE = 38  # an item that check_info's sample of 64 in 96 does not hold


@pytest.mark.parametrize("mode", ["images", "tensors"])
def test_a_label_outside_the_sample_is_one_line(projects, capsys, tmp_path, mode):
    """The loader checks each batch as it makes it, in its workers where there are any (the
    test of an unreadable image in test_robustness.py has them), without a host sync."""
    flags = [*FLAGS[mode], "--out-dir", str(tmp_path)]
    change = target(lambda i, split, label: 10 if i == OUTSIDE and split == "train" else label)
    assert refusal(projects[mode], capsys, *flags, change=change) == (
        1,
        [f"error: {SET}: target 10, {CLASSES}"],
    )


@pytest.mark.parametrize("mode", ["images", "tensors"])
def test_an_item_of_another_shape_outside_the_sample_is_one_line(projects, capsys, tmp_path, mode):
    flags = [*FLAGS[mode], "--out-dir", str(tmp_path)]

    def change(i, split, inputs, label):
        return (inputs[..., :-1] if i == OUTSIDE and split == "train" else inputs, label)

    shape, short = SHAPES[mode]
    assert refusal(projects[mode], capsys, *flags, change=change) == (
        1,
        [f"error: {SET}: inputs of shape {short}, its DataInfo says {shape}"],
    )


@pytest.mark.parametrize("mode", ["images", "tensors"])
def test_a_loss_not_finite_from_the_start_stops_without_blaming_the_lr(
    projects, capsys, tmp_path, monkeypatch, mode
):
    """The loss is NaN from the first step on (a loss of one's own that takes log 0, say; NaN
    in the data is refused before). The first loss is already not finite, before any update,
    so the lr is not the cause; and no checkpoint was written, so none is said to stay. With
    the guard, its stop says so; without it, the checkpoint's check on the weights."""
    out = tmp_path / "out"
    flags = [*FLAGS[mode], "--log-interval", "2", "--out-dir", str(out)]
    flags += ["--max-bad-steps", "2"] if mode == "images" else []
    cross_entropy = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: cross_entropy(*a, **k) * math.nan)
    status, lines = refusal(projects[mode], capsys, *flags)
    if mode == "images":
        expected = (
            f"2 optimizer steps in a row had a non-finite loss; no checkpoint was written to "
            f"{out}. So was the first, before any update: look for NaN or inf in the data"
        )
    else:
        expected = (
            f"the weights are no longer finite (NaN or inf) after step 6, so best.pt was not "
            f"written; no checkpoint was written to {out}. Try a lower --lr or --clip-grad, "
            "or look for NaN or inf in the data"
        )
    assert (status, lines) == (1, [expected])
    assert not list(out.glob("*.pt"))


def test_a_loss_not_finite_from_a_resume_on_is_not_before_any_update(
    projects, capsys, tmp_path, monkeypatch
):
    """Resumed, the model has had its updates: the guard's stop after bad steps from the
    resume on does not say the first loss came before any update."""
    out = tmp_path / "out"
    flags = [*FLAGS["images"], "--log-interval", "2", "--max-bad-steps", "2", "--out-dir", str(out)]
    with inside(projects["images"]):
        sys.argv = ["train.py", *TINY_RUN, *flags, "--epochs", "1"]
        runpy.run_path("train.py", run_name="__main__")
    cross_entropy = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: cross_entropy(*a, **k) * math.nan)
    assert refusal(projects["images"], capsys, *flags) == (
        1,
        [
            f"2 optimizer steps in a row had a non-finite loss; the last checkpoint in {out} "
            "is from before them. Try a lower --lr or --clip-grad, or look for NaN or inf in "
            "the data"
        ],
    )


def test_checking_the_data_leaves_the_random_state_alone(projects):
    """The sample's augmentation draws from a random state of its own: the model's first
    weights do not depend on the check."""
    with inside(projects["images"]):
        from proj.data import build_dataset

        args = argparse.Namespace(data="synthetic", synthetic_size=96, image_size=8, hflip=None)
        torch.manual_seed(0)
        build_dataset(args)
        after = torch.get_rng_state()
        torch.manual_seed(0)
        assert torch.equal(after, torch.get_rng_state())


def image_folder(root, per_class: int = 4):
    """Two classes of small images in train/ and val/."""
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(per_class):
                image = Image.new("RGB", (12, 12), (60 * i, 0, 0))
                image.save(root / split / label / f"{i}.png")
    return root


def build_image_folder(project, root):
    with inside(project):
        from proj.data import build_dataset

        args = argparse.Namespace(data="imagefolder", data_dir=str(root), image_size=8)
        return build_dataset(argparse.Namespace(**vars(args), hflip=None))


def test_an_image_folder_walks_each_folder_once(projects, tmp_path):
    """Links are followed, but into a folder once: one linked to itself, one that links back
    up, and two links to the same folder outside are each walked once (torchvision's
    ImageFolder walked the first two again and again, 40 levels deep); one up to the folder
    of the classes is not walked (it would take the other classes' images into this one)."""
    root = image_folder(tmp_path / "images")
    train = root / "train"
    (train / "a" / "loop").symlink_to(".")
    (train / "a" / "classes").symlink_to("..")
    (train / "b" / "sub").mkdir()
    for name in ("s0.png", "s1.png"):
        Image.new("RGB", (12, 12)).save(train / "b" / "sub" / name)
    (train / "b" / "sub" / "up").symlink_to("..")
    (tmp_path / "outside").mkdir()
    Image.new("RGB", (12, 12)).save(tmp_path / "outside" / "o.png")
    (train / "a" / "l1").symlink_to(tmp_path / "outside")
    (train / "a" / "l2").symlink_to(tmp_path / "outside")
    train_set, val_set, info = build_image_folder(projects["images"], root)
    a = [(f"{train}/a/{i}.png", 0) for i in range(4)] + [(f"{train}/a/l1/o.png", 0)]
    b = [(f"{train}/b/{i}.png", 1) for i in range(4)]
    b += [(f"{train}/b/sub/s0.png", 1), (f"{train}/b/sub/s1.png", 1)]
    assert train_set.samples == a + b
    assert len(val_set) == 8 and info.num_classes == 2


def test_hidden_folders_are_no_classes(projects, tmp_path):
    """Jupyter leaves .ipynb_checkpoints in every folder it opens: hidden, so no class."""
    root = image_folder(tmp_path / "images")
    for split in ("train", "val"):
        (root / split / ".ipynb_checkpoints").mkdir()
    train_set, val_set, info = build_image_folder(projects["images"], root)
    assert train_set.classes == val_set.classes == ["a", "b"] and info.num_classes == 2


def test_a_pipe_named_like_an_image_is_one_line_not_a_hang(projects, tmp_path):
    """Opening a named pipe waits for a writer: found while the folder is walked, before
    anything would open it."""
    root = image_folder(tmp_path / "images")
    os.mkfifo(root / "train" / "b" / "camera.png")

    def hung(signum, frame):
        raise TimeoutError("the pipe was opened")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        with pytest.raises(Exception) as error:
            build_image_folder(projects["images"], root)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    assert type(error.value).__name__ == "DataError"
    assert str(error.value) == f"{root}/train/b/camera.png: not a file but a pipe, socket or device"


def broken_images(folder):
    """name: (how to make the file, what cannot be read in it)"""
    limit = Image.MAX_IMAGE_PIXELS

    def truncated(path):
        Image.effect_noise((40, 40), 60).save(path)
        path.write_bytes(path.read_bytes()[:400])

    return {
        "cut short": (truncated, "image file is truncated"),
        "not an image": (lambda path: path.write_text("not an image\n"), "not an image PIL knows"),
        "a broken link": (
            lambda path: path.symlink_to(folder / "gone.png"),
            "No such file or directory",
        ),
        # PIL's guard against decompression bombs: past its limit it warns, past twice it
        # refuses; both are refused here. A 1-bit image of zeros is small to write.
        "past the limit": (
            lambda path: Image.new("1", (10_000, 10_000)).save(path),
            f"Image size (100000000 pixels) exceeds limit of {limit} pixels, could be "
            "decompression bomb DOS attack.",
        ),
        "past twice the limit": (
            lambda path: Image.new("1", (20_000, 9_000)).save(path),
            f"Image size (180000000 pixels) exceeds limit of {2 * limit} pixels, could be "
            "decompression bomb DOS attack.",
        ),
    }


@pytest.mark.parametrize("kind", list(broken_images(None)), ids=str)
def test_an_image_that_cannot_be_read_is_one_line_naming_it(projects, tmp_path, kind):
    root = image_folder(tmp_path / "images")
    make, reason = broken_images(tmp_path)[kind]
    make(root / "val" / "b" / "bad.png")
    with pytest.raises(Exception) as error:
        build_image_folder(projects["images"], root)
    assert type(error.value).__name__ == "DataError"
    assert str(error.value) == f"{root}/val/b/bad.png: cannot read this image ({reason})"


@pytest.mark.parametrize("mode", ["images", "tensors"])
def test_NaN_outside_the_sample_is_one_line(projects, capsys, tmp_path, mode):
    """NaN in an item that check_info's sample does not hold: the loader's check of each
    batch (the in-memory path: of every item at once) refuses it before a step takes it."""

    def change(i, split, inputs, label):
        return inputs.float() * (math.nan if i == OUTSIDE and split == "train" else 1), label

    flags = [*FLAGS[mode], "--out-dir", str(tmp_path)]
    assert refusal(projects[mode], capsys, *flags, change=change) == (
        1,
        [f"error: {SET}: NaN or inf in its inputs"],
    )
    assert not list(tmp_path.glob("*.pt"))


def test_one_class_is_one_line(projects, capsys, tmp_path):
    flags = [*FLAGS["images"], "--out-dir", str(tmp_path)]
    assert refusal(projects["images"], capsys, *flags, classes=1) == (
        1,
        [
            f"error: {SET}, training item 0: DataInfo.num_classes is 1, where the default "
            "cross-entropy needs 2 or more"
        ],
    )


FLOATS = torch.randn(8, 1, 4)
UNIT = torch.rand(8, 1, 4)  # floats from 0 to 1
BYTES = torch.randint(256, (8, 1, 4), dtype=torch.uint8)


@pytest.mark.parametrize(
    ("inputs", "std", "mean", "problem"),
    [
        (FLOATS, (0.0,), (0.0,), "its std (0.0,) has a value that is not positive and finite"),
        (FLOATS, (-1.0,), (0.0,), "its std (-1.0,) has a value that is not positive and finite"),
        (FLOATS, (math.nan,), (0.0,), "its std (nan,) has a value that is not positive and finite"),
        (FLOATS, (1.0,), (math.inf,), "its mean (inf,) has a value that is not finite"),
        (FLOATS, None, (0.0,), "its DataInfo gives a mean without a std, or a std without a mean"),
        (FLOATS, (1.0, 1.0), (0.0, 0.0), "its mean and std need 1 values (one per channel, "),
        (BYTES, (0.25,), (0.5,), "its mean and std look like 0-1 units, but its inputs are "),
        (UNIT, (60.0,), (120.0,), "its mean is far outside its float inputs' range (0-255 "),
        (UNIT, (0.25,), (0.5,), None),  # 0-1 statistics of 0-1 floats
        (BYTES, (60.0,), (120.0,), None),
        (BYTES > 127, (0.5,), (0.5,), None),  # bool: 0 or 1
    ],
)
def test_statistics_that_cannot_normalise_are_one_line(projects, inputs, std, mean, problem):
    with inside(projects["tensors"]):
        from proj import data

        train_set = torch.utils.data.TensorDataset(inputs, torch.arange(8) % 2)
        info = data.DataInfo(2, (1, 4), mean, std)
        if problem is None:
            data.check_info(train_set, info, "ours", train_set)
            return
        with pytest.raises(data.DataError) as refused:
            data.check_info(train_set, info, "ours", train_set)
    assert str(refused.value).startswith(f"data set 'ours': {problem}")


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from zip(torch.randn(8, 4), torch.arange(8) % 2, strict=True)


class Unsized(torch.utils.data.Dataset):
    def __getitem__(self, i):
        return torch.randn(4), i % 2


class Records(torch.utils.data.Dataset):
    """Inputs as a list of numbers, or as a dict of tensors (a tokenizer's)."""

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        if self.kind is list:
            return [0.5, 1.5, 2.5, 3.5], i % 2
        return {"input_ids": torch.arange(4), "attention_mask": torch.ones(4)}, i % 2


DATA_INFO_MISTAKES = {
    "a list of numbers": (
        Records(list),
        {},
        ", training item 0: inputs of type list, where the model takes a tensor",
    ),
    "a dict of tensors": (
        Records(dict),
        {},
        ", training item 0: inputs of type dict, where the model takes a tensor",
    ),
    "an IterableDataset": (
        Stream(),
        {},
        ": its training set has no items by index: the loop takes a map-style Dataset "
        "(__getitem__ and __len__), not an IterableDataset",
    ),
    "no __len__": (Unsized(), {}, ": its training set has no items by index: "),
    "floats as ids": (
        torch.utils.data.TensorDataset(torch.rand(8, 4), torch.arange(8) % 2),
        {"dtype": torch.int64},
        ": its inputs are floats, which its dtype torch.int64 would cut to integers",
    ),
    "scalars per channel": (
        torch.utils.data.TensorDataset(torch.randn(8), torch.arange(8) % 2),
        {"mean": (0.0,), "std": (1.0,)},
        ": its mean and std are per channel (dimension 0), but its inputs are scalars",
    ),
}


@pytest.mark.parametrize(
    ("train_set", "given", "problem"), DATA_INFO_MISTAKES.values(), ids=DATA_INFO_MISTAKES.keys()
)
def test_data_the_loop_cannot_take_is_one_line(projects, train_set, given, problem):
    with inside(projects["tensors"]):
        from proj import data

        shape = (
            tuple(train_set[0][0].shape)
            if isinstance(train_set, torch.utils.data.TensorDataset)
            else (4,)
        )
        info = data.DataInfo(2, shape, **given)
        with pytest.raises(data.DataError) as refused:
            data.check_info(train_set, info, "ours", train_set)
    assert str(refused.value).startswith(f"data set 'ours'{problem}")


def test_targets_that_are_not_a_tensor_are_one_line(projects, monkeypatch):
    """A target_problem of the user's that passes a dict of several tasks' targets: the
    loop moves one tensor of targets to the device, and says so rather than fail there."""
    with inside(projects["tensors"]):
        from proj import data

        class Tasks(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return torch.randn(4), {"kind": i % 2, "size": float(i)}

        monkeypatch.setattr(data, "target_problem", lambda targets, info: None)
        with pytest.raises(data.DataError) as refused:
            data.check_info(Tasks(), data.DataInfo(2, (4,)), "ours", Tasks())
    assert str(refused.value) == (
        "data set 'ours', training item 0: targets of type dict, where the loop takes a tensor"
    )


def test_statistics_of_token_ids_are_one_line(projects):
    with inside(projects["tensors"]):
        from proj import data

        ids = torch.utils.data.TensorDataset(torch.randint(9, (8, 1, 4)), torch.arange(8) % 2)
        info = data.DataInfo(2, (1, 4), (4.0,), (2.0,), dtype=torch.int64)
        with pytest.raises(data.DataError) as refused:
            data.check_info(ids, info, "ours", ids)
    assert str(refused.value) == (
        "data set 'ours': its mean and std make its inputs floats, but its dtype is torch.int64"
    )


def test_no_validation_set_is_one_line(projects, capsys, monkeypatch, tmp_path):
    """build_dataset returns a validation set: None for one is refused in one line."""
    with inside(projects["images"]):
        from proj import data

        class TrainOnly(data.SyntheticImages):
            def __new__(cls, *args, split="train", **kwargs):
                return None if split == "val" else super().__new__(cls)

        monkeypatch.setattr(data, "SyntheticImages", TrainOnly)
        with pytest.raises(data.DataError) as refused:
            data.build_dataset(__import__("train").get_args_parser().parse_args([*FLAGS["images"]]))
    assert str(refused.value) == (
        "data set 'synthetic': no validation set (build_dataset returns one)"
    )


def test_a_set_smaller_than_a_batch_is_one_line_with_the_batch_to_take(projects, capsys):
    assert refusal(projects["images"], capsys, *FLAGS["images"], lengths={"train": 10}) == (
        1,
        ["error: 10 training items make no full batch of 16: give --batch-size 10 or less"],
    )


@pytest.mark.parametrize("mode", ["images", "tensors"])
def test_a_model_that_does_not_fit_the_data_is_one_line(projects, capsys, tmp_path, mode):
    """A model made for other inputs (here one of the user's, for 10 features) is refused
    before anything trains, in one line with what the model raised on the data's shape."""
    shape, features = {"images": ("(3, 8, 8)", 192), "tensors": ("(1, 64)", 64)}[mode]
    with inside(projects[mode]):
        from proj import models

        models.MODELS["ten_features"] = lambda info: torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(10, info.num_classes)
        )
        sys.argv = ["train.py", *TINY_RUN, *FLAGS[mode], "--model", "ten_features"]
        sys.argv += ["--out-dir", str(tmp_path)]
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path("train.py", run_name="__main__")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"train.py: error: argument --model: ten_features fails on inputs of shape {shape} "
        f"(RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x{features} and 10x10))"
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == [".lock"]  # nothing trained


def test_a_model_with_other_outputs_than_classes_is_one_line(projects, capsys, tmp_path):
    """A matrix of outputs, one row per input, needs DataInfo.num_classes columns (the
    default loss would fail on a class index past them, on a GPU as a device-side assert);
    outputs of other shapes (a tuple, a sequence's) are the loss's to judge."""
    with inside(projects["tensors"]):
        from proj import data, models

        models.MODELS["two_outputs"] = lambda info: torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64, 2)
        )
        sys.argv = ["train.py", *TINY_RUN, *FLAGS["tensors"], "--model", "two_outputs"]
        sys.argv += ["--out-dir", str(tmp_path)]
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path("train.py", run_name="__main__")
        info = data.DataInfo(10, (1, 64))
        sequence = torch.nn.Sequential(torch.nn.Unflatten(-1, (8, 8)), torch.nn.Flatten(0, 1))
        assert models.model_problem(sequence, info, torch.device("cpu")) is None  # 3-d: (2, 8, 8)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "train.py: error: argument --model: two_outputs gives 2 outputs per input, where "
        "DataInfo.num_classes is 10"
    ]


class Viewed(torch.nn.Module):
    """A convolution, then its outputs flattened with .view, which channels_last refuses."""

    def __init__(self, info) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, info.num_classes)

    def forward(self, x):
        x = self.conv(x)
        return self.fc(x.view(len(x), -1))


def test_lazy_modules_train_and_channels_last_is_named_when_it_fails(projects, capsys, tmp_path):
    """A model with a lazy module has no weights to lay out until its first forward, which
    the check of the model gives it; a .view that channels_last inputs refuse is one line
    that names the layout."""
    with inside(projects["images"]):
        from proj import models

        models.MODELS["lazy"] = lambda info: torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(info.num_classes)
        )
        models.MODELS["viewed"] = Viewed
        flags = [*TINY_RUN, "--image-size", "8", "--epochs", "1", "--channels-last"]
        sys.argv = ["train.py", *flags, "--model", "lazy", "--out-dir", str(tmp_path / "lazy")]
        runpy.run_path("train.py", run_name="__main__")
        sys.argv = ["train.py", *flags, "--model", "viewed", "--out-dir", str(tmp_path / "v")]
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path("train.py", run_name="__main__")
    assert (tmp_path / "lazy/last.pt").is_file()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "train.py: error: argument --model: viewed fails on channels_last inputs of shape "
        "(3, 8, 8) (RuntimeError: view size is not compatible with input tensor's size and "
        "stride (at least one dimension spans across two contiguous subspaces). Use "
        ".reshape(...) instead.)"
    ]


def test_the_built_in_mlp_takes_scalar_inputs(projects):
    """A data set of one number per item (DataInfo.input_shape ()) fits the built-in mlp, and
    model_problem, which finds so, leaves the model in train mode."""
    with inside(projects["tensors"]):
        from proj import data, models

        info = data.DataInfo(3, ())
        model = models.build_model("mlp", info)
        assert models.model_problem(model, info, torch.device("cpu")) is None
        assert model.training  # the check leaves the model's mode as it found it
        inputs = torch.randn(5)
        expected = model.net[1:](inputs[:, None])  # its layers after Flatten, on (N, 1)
        assert torch.equal(model(inputs), expected) and expected.shape == (5, 3)
