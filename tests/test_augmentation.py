"""Augmentation only where it belongs, in the loaders that train.py builds (build_dataset and
build_loaders, run in this process): validation items are the same tensors whatever the
random state and in every epoch, the images as stored where nothing resizes them; training
items are drawn anew each epoch where the data set augments (the built-in images, a
torchvision set, an image folder at both sizes; on the loader path and on the device), from
(seed, epoch) alone, and stay as they are where nothing augments (the built-in signals)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from tests.helpers import inside, render


@pytest.fixture(scope="module")
def projects(template, tmp_path_factory):
    root = tmp_path_factory.mktemp("augmentation")
    return {
        "images": render(template, root / "images"),
        "tensors": render(template, root / "tensors", data="tensors", extras=[]),
    }


def shake(seed: int) -> None:
    """Another global random state, in every generator a transform might draw from."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def idx_file(path, values: torch.Tensor) -> None:
    """`values` (uint8) in the IDX format of the MNIST files."""
    header = bytes([0, 0, 8, values.ndim]) + b"".join(n.to_bytes(4, "big") for n in values.shape)
    path.write_bytes(header + values.numpy().tobytes())


def fashion_mnist(root, folder: str = "FashionMNIST") -> torch.Tensor:
    """A tiny Fashion-MNIST (or MNIST, in its `folder`) in `root`, as torchvision's download
    leaves it; returns its validation (t10k) images, N x 1 x 28 x 28."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    for split, count in (("train", 24), ("t10k", 6)):
        images = torch.randint(256, (count, 28, 28), generator=gen, dtype=torch.uint8)
        idx_file(raw / f"{split}-images-idx3-ubyte", images)
        idx_file(raw / f"{split}-labels-idx1-ubyte", torch.arange(count, dtype=torch.uint8) % 10)
    return images.unsqueeze(1)


def image_folder(root, side: int, size: int) -> torch.Tensor | None:
    """root/train and root/val, two classes of noise images `side` pixels wide and high;
    returns the validation images' pixels, N x 3 x side x side, in the order read."""
    gen = torch.Generator().manual_seed(0)
    stored = []
    for split, count in (("train", 12), ("val", 2)):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = torch.randint(256, (side, side, 3), generator=gen, dtype=torch.uint8)
                Image.fromarray(pixels.numpy()).save(root / split / name / f"{i}.png")
                stored += [pixels.permute(2, 0, 1)] if split == "val" else []
    # At the size asked for, the images are resized by nothing: they come back as stored.
    return torch.stack(stored) if side == size else None


# Each data set that augments: its flags, and what makes it in --data-dir (the built-in set
# is made on the spot) and returns its validation images as stored, where it can.
SETS = {
    "synthetic": (["--data", "synthetic", "--synthetic-size", "40", "--image-size", "8"], None),
    "fashion-mnist": (["--data", "fashion-mnist"], fashion_mnist),
    "imagefolder-16": (
        ["--data", "imagefolder", "--image-size", "16"],
        lambda root: image_folder(root, 16, 16),
    ),
    "imagefolder-96": (
        ["--data", "imagefolder", "--image-size", "96"],
        lambda root: image_folder(root, 120, 96),
    ),
}
# Where the training set is loaded from: the loader path, and the device where it can be (an
# image folder is read from the disk).
PATHS = [
    (name, on_device)
    for name in SETS
    for on_device in ("off", "on")
    if on_device == "off" or not name.startswith("imagefolder")
]


def loaders(flags: list[str], data_dir) -> tuple:
    """(training set, validation set, training batches, validation loader, sampler) as the
    project's train.py builds them for `flags`; call inside the project."""
    import train
    from proj.data import build_dataset, build_loaders

    flags = ["--device", "cpu", "--batch-size", "4", "--workers", "0", *flags]
    args = train.get_args_parser().parse_args([*flags, "--data-dir", str(data_dir)])
    train_set, val_set, info = build_dataset(args)
    batches, val_loader, sampler = build_loaders(
        train_set, val_set, info, args, torch.device("cpu")
    )
    return train_set, val_set, batches, val_loader, sampler


def validation_items(val_loader, sampler) -> list[torch.Tensor]:
    """The validation inputs, under two other random states, in two epochs each."""
    views = []
    for seed in (1, 2):
        shake(seed)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            views.append(torch.cat([inputs for inputs, _ in val_loader]))
    return views


def training_items(batches, sampler, epoch: int, seed: int) -> dict[int, torch.Tensor]:
    """Each training input of `epoch`, by its index in the training set, drawn under global
    random state `seed`."""
    shake(seed)
    sampler.set_epoch(epoch)
    # The loader, or whole batches indexed from a TensorDataset (data: tensors): in the order
    # of the sampler's (index, seed) keys.
    if isinstance(batches, DataLoader) or not hasattr(batches, "labels"):
        inputs = torch.cat([x for x, _ in batches])
        order = [index for index, _ in sampler][: len(inputs)]  # less the batch dropped
        return dict(zip(order, inputs, strict=True))
    # The set on the device: its labels made the items' indices, to tell them apart.
    batches.labels = torch.arange(len(batches.labels))
    return {int(i): x for xs, ys in batches for x, i in zip(xs, ys, strict=True)}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[i], b[i]) for i in a)


@pytest.mark.parametrize(("name", "on_device"), PATHS)
def test_validation_is_never_augmented_and_training_anew_each_epoch(
    projects, tmp_path, name, on_device
):
    flags, make = SETS[name]
    stored = make(tmp_path) if make else None
    with inside(projects["images"]):
        train_set, val_set, batches, val_loader, sampler = loaders(
            [*flags, "--data-on-device", on_device], tmp_path
        )
        assert isinstance(batches, DataLoader) == (on_device == "off")
        views = validation_items(val_loader, sampler)
        first = training_items(batches, sampler, epoch=0, seed=1)
        again = training_items(batches, sampler, epoch=0, seed=2)
        second = training_items(batches, sampler, epoch=1, seed=1)
    for view in views[1:]:
        assert torch.equal(view, views[0])
    if name == "synthetic":
        stored = val_set.images
    if stored is not None:
        assert torch.equal(views[0], stored)
    assert same(first, again)  # (seed, epoch) alone decide the draws: exact resume needs it
    common = first.keys() & second.keys()
    assert len(common) >= len(train_set) // 2
    changed = [i for i in common if not torch.equal(first[i], second[i])]
    # A crop and a flip drawn from 50 outcomes or more: few items come out the same twice.
    assert len(changed) > 0.8 * len(common), (len(changed), len(common))


def test_signals_are_never_augmented(projects, tmp_path):
    """The built-in signals augment nothing: training items are the same in every epoch
    and under any random state, and both sets are their stored inputs."""
    with inside(projects["tensors"]):
        train_set, val_set, batches, val_loader, sampler = loaders(
            ["--synthetic-size", "40"], tmp_path
        )
        views = validation_items(val_loader, sampler)
        first = training_items(batches, sampler, epoch=0, seed=1)
        second = training_items(batches, sampler, epoch=1, seed=2)
    for view in views:
        assert torch.equal(view, val_set.inputs)
    assert len(first) == len(train_set) and same(first, second)
    assert all(torch.equal(x, train_set.inputs[i]) for i, x in first.items())


@pytest.mark.parametrize(
    ("name", "folder", "hflip"), [("mnist", "MNIST", 0.0), ("fashion-mnist", "FashionMNIST", 0.5)]
)
def test_digits_are_not_mirrored_by_default_clothes_are(projects, tmp_path, name, folder, hflip):
    """A mirrored digit is another symbol (or none); a mirrored shirt is a shirt."""
    fashion_mnist(tmp_path, folder)
    with inside(projects["images"]):
        import train
        from proj.data import build_dataset

        flags = ["--data", name, "--data-dir", str(tmp_path)]
        train_set, _, info = build_dataset(train.get_args_parser().parse_args(flags))
    flips = [step.p for step in train_set.transform.transforms[1].transforms if "Flip" in str(step)]
    assert flips == ([hflip] if hflip else []) and info.hflip == hflip  # the loader's, the device's
