"""The training set kept on the device: same augmentation as the loader path, every sample
once per epoch, resumable mid-epoch."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import unittest.mock

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import inside, render


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("device") / "p")


@pytest.fixture(scope="module")
def data_module(project):
    with inside(project):
        yield importlib.import_module("proj.data")


@pytest.fixture(scope="module")
def device_module(project):
    with inside(project):
        yield importlib.import_module("proj.device_data")


@contextlib.contextmanager
def as_process(module, rank: int, processes: int):
    """Code of a DDP project's `module` run as process `rank` of `processes`."""
    with unittest.mock.patch.object(module, "rank", lambda: rank):
        with unittest.mock.patch.object(module, "process_count", lambda: processes):
            yield


def candidates(image: torch.Tensor, flip: bool) -> torch.Tensor:
    """Every crop of the image padded by 4 reflected pixels, flipped too if `flip`."""
    h, w = image.shape[-2:]
    padded = F.pad(image.float()[None], (4, 4, 4, 4), mode="reflect")[0]
    crops = [padded[:, y : y + h, x : x + w] for y in range(9) for x in range(9)]
    if flip:
        crops += [crop.flip(-1) for crop in crops]
    return torch.stack(crops)


def which(output: torch.Tensor, image: torch.Tensor, flip: bool) -> int:
    matches = (candidates(image, flip) == output.float()).flatten(1).all(1).nonzero()
    assert len(matches) >= 1, "not a crop of the padded image"
    return int(matches[0])


def test_device_and_loader_paths_augment_alike(data_module, device_module):
    images = torch.randint(0, 256, (64, 3, 12, 12), dtype=torch.uint8)
    labels = torch.arange(64)
    device_data = device_module.DeviceData(images, labels, 16, 0, 0.5, torch.device("cpu"))
    loader_augment = data_module.augment(12, hflip=0.5)
    seen_device, seen_loader, count = set(), set(), 0
    for batch, batch_labels in device_data:
        for output, label in zip(batch, batch_labels, strict=True):
            seen_device.add(which(output, images[label], True))
            seen_loader.add(which(loader_augment(images[label]), images[label], True))
            count += 1
    assert count == 64 and len(seen_device) > 20 and len(seen_loader) > 20
    flipped = {i for i in seen_device if i >= 81}
    assert flipped and flipped != seen_device  # both flipped and plain crops occur


@pytest.mark.parametrize("hflip", [0.0, 1.0])
def test_hflip_is_the_chance_of_a_flip_on_both_paths(data_module, device_module, hflip):
    images = torch.randint(0, 256, (32, 3, 12, 12), dtype=torch.uint8)
    labels = torch.arange(32)
    device_data = device_module.DeviceData(images, labels, 16, 0, hflip, torch.device("cpu"))
    loader_augment = data_module.augment(12, hflip=hflip)
    flipped = []
    for batch, batch_labels in device_data:
        for output, label in zip(batch, batch_labels, strict=True):
            flipped.append(which(output, images[label], True) >= 81)
            flipped.append(which(loader_augment(images[label]), images[label], True) >= 81)
    assert flipped == [hflip == 1.0] * 64


def test_each_sample_once_per_epoch_and_resume_continues_exactly(data_module, device_module):
    images = torch.randint(0, 256, (100, 1, 8, 8), dtype=torch.uint8)
    labels = torch.arange(100)

    def epoch(start=0):
        data = device_module.DeviceData(images, labels, 10, 3, 0.0, torch.device("cpu"))
        data.set_epoch(2, start=start)
        return [(x.clone(), y.clone()) for x, y in data]

    whole = epoch()
    assert sorted(torch.cat([y for _, y in whole]).tolist()) == list(range(100))
    resumed = epoch(start=40)  # four batches already trained
    assert len(resumed) == 6
    for (x, y), (x2, y2) in zip(whole[4:], resumed, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


@pytest.mark.parametrize("seed", [3, 2**32 - 1])
def test_each_process_draws_its_own_crops_from_any_seed(device_module, ddp_data_module, seed):
    """Two processes crop and flip their batches with draws of their own (as the loader path's
    per-sample seeds do), and the largest --seed overflows no generator."""
    images = torch.arange(64, dtype=torch.uint8).view(1, 1, 8, 8).expand(80, 1, 8, 8)
    labels = torch.arange(80)
    batches = []
    device_data = ddp_data_module[1]
    for rank in (0, 1):
        with as_process(device_data, rank, 2):
            data = device_data.DeviceData(images, labels, 10, seed, 0.5, torch.device("cpu"))
        data.set_epoch(1)
        batches.append([x for x, _ in data])
    assert len(batches[0]) == len(batches[1]) == 4
    # Every image is the same, so equal batches would mean equal draws.
    assert not any(torch.equal(a, b) for a, b in zip(*batches, strict=True))
    alone = device_module.DeviceData(images, labels, 10, seed, 0.5, torch.device("cpu"))
    assert len(list(alone)) == 8  # a single process, from the same seed


def test_auto_keeps_in_memory_sets_on_a_cpu_and_loads_image_folders(
    data_module, device_module, tmp_path
):
    from PIL import Image

    cpu = torch.device("cpu")
    synthetic = data_module.SyntheticImages(32, 8)
    tensors = data_module.in_memory_tensors(synthetic)
    assert tensors[0] is synthetic.images and tensors[1] is synthetic.labels
    assert device_module.keep_on_device(tensors, "auto", cpu)
    assert not device_module.keep_on_device(tensors, "off", cpu)
    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / split / "a" / "0.png")
    folder, _, _ = data_module.image_folder(tmp_path, 8, None)
    assert data_module.in_memory_tensors(folder) is None  # read from disk
    assert not device_module.keep_on_device(None, "auto", cpu)
    with pytest.raises(data_module.DataError, match="needs a data set held in memory"):
        device_module.keep_on_device(None, "on", cpu)
    # A device that is neither the CPU nor CUDA (mps) keeps the loader.
    assert not device_module.keep_on_device(tensors, "auto", torch.device("meta"))


def test_a_set_kept_on_the_device_stays_uint8_in_a_quarter_of_the_free_memory(
    device_module, monkeypatch
):
    """The images are kept as the bytes they are (a quarter of float32), not copied where
    they already are; on CUDA, auto keeps a set that takes less than a quarter of the free
    memory (the rest stays the model's), here with the free memory as CUDA would report it."""
    images = torch.randint(256, (20, 3, 8, 8), dtype=torch.uint8)
    data = device_module.DeviceData(images, torch.arange(20), 4, 0, 0.5, torch.device("cpu"))
    assert data.images.dtype == torch.uint8 and data.images.data_ptr() == images.data_ptr()
    tensors, cuda = (images, torch.arange(20)), torch.device("cuda")
    for free, kept in ((4 * images.nbytes + 4, True), (4 * images.nbytes + 3, False)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 2 * free))
        assert device_module.keep_on_device(tensors, "auto", cuda) is kept, free
        assert device_module.keep_on_device(tensors, "on", cuda) is True
        assert device_module.keep_on_device(tensors, "off", cuda) is False


def test_in_memory_tensors_of_torchvision_sets_and_not_of_other_sets(data_module):
    """CIFAR holds N x H x W x C arrays and MNIST N x H x W tensors; both come out as
    N x C x H x W uint8. A set of one's own with `data` and `targets` is left to the loader,
    which runs its transform."""
    import numpy as np
    import torchvision

    cifar = torchvision.datasets.CIFAR10.__new__(torchvision.datasets.CIFAR10)
    cifar.data = np.arange(4 * 32 * 32 * 3, dtype=np.uint8).reshape(4, 32, 32, 3)
    cifar.targets = [0, 1, 2, 3]
    images, labels = data_module.in_memory_tensors(cifar)
    assert images.shape == (4, 3, 32, 32) and images.is_contiguous()
    assert torch.equal(images[1, 2], torch.from_numpy(cifar.data[1, :, :, 2]))
    assert labels.tolist() == [0, 1, 2, 3]
    mnist = torchvision.datasets.MNIST.__new__(torchvision.datasets.MNIST)
    mnist.data = torch.zeros(5, 28, 28, dtype=torch.uint8)
    mnist.targets = torch.arange(5)
    images, labels = data_module.in_memory_tensors(mnist)
    assert images.shape == (5, 1, 28, 28)
    # Tensors already in memory are used as they are, not copied (torch.as_tensor).
    assert images.data_ptr() == mnist.data.data_ptr()
    assert labels.data_ptr() == mnist.targets.data_ptr()

    class Own(torch.utils.data.Dataset):
        data, targets = cifar.data, cifar.targets

    assert data_module.in_memory_tensors(Own()) is None


def reference_augment(images, gen, hflip):
    """The crop and flip spelled out: pad by 4 reflected pixels, crop at offsets drawn
    (dy, dx) per image, then mirror with chance hflip, drawing in that order."""
    n, c, h, w = images.shape
    padded = F.pad(images.float(), (4, 4, 4, 4), mode="reflect")
    dy, dx = torch.randint(9, (2, n), generator=gen)
    out = torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])
    if hflip > 0:
        flip = torch.rand(n, generator=gen) < hflip
        out[flip] = out[flip].flip(3)
    return out


@pytest.mark.parametrize("shape", [(3, 10, 13), (1, 5, 7), (3, 32, 32)])
@pytest.mark.parametrize("hflip", [0.0, 0.5, 1.0])
def test_augmentation_matches_the_spelled_out_crop_and_flip(
    data_module, device_module, shape, hflip
):
    """Bit for bit, with the same random draws: runs resumed across releases and the loader
    path's semantics depend on it."""
    images = torch.randint(0, 256, (40, *shape), dtype=torch.uint8)
    data = device_module.DeviceData(images, torch.zeros(40), 40, 0, hflip, torch.device("cpu"))
    out = data.augment(images, torch.Generator().manual_seed(5))
    assert out.dtype == torch.float32
    assert torch.equal(out, reference_augment(images, torch.Generator().manual_seed(5), hflip))


def test_crop_indices_reflect_at_both_ends(data_module, device_module):
    crops = device_module.reflected_crops(5, torch.device("cpu"), padding=2)
    assert crops.tolist() == [
        [2, 1, 0, 1, 2],  # padded positions -2, -1 read pixels 2, 1
        [1, 0, 1, 2, 3],
        [0, 1, 2, 3, 4],  # no shift
        [1, 2, 3, 4, 3],
        [2, 3, 4, 3, 2],  # padded positions 5, 6 read pixels 3, 2
    ]
    with pytest.raises(data_module.DataError, match="too small to pad by 4"):
        device_module.reflected_crops(4, torch.device("cpu"))


@pytest.mark.parametrize("channels_last", [False, True])
def test_batches_are_normalised_in_the_memory_format_asked_for(data_module, channels_last):
    """(x - mean) / std per channel, on uint8 images as both paths deliver them, in the layout
    that --channels-last asks for."""
    info = data_module.DataInfo(10, (3, 8, 8), mean=(127.5, 63.75, 0.0), std=(127.5, 63.75, 255))
    batches = data_module.DeviceBatches(None, info, torch.device("cpu"), channels_last)
    images = torch.randint(256, (4, 3, 8, 8), dtype=torch.uint8)
    # A cropped view, as the on-device set may hand over.
    out, targets = batches.prepare(images[..., :6, 1:7], torch.arange(4))
    mean = torch.tensor([0.5, 0.25, 0.0]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.5, 0.25, 1.0]).view(1, 3, 1, 1) * 255
    torch.testing.assert_close(out, (images[..., :6, 1:7].float() - mean) / std)
    assert torch.equal(targets, torch.arange(4))
    layout = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=layout)


def test_the_synthetic_sets_are_their_splits_with_their_own_statistics(data_module):
    """What build_dataset makes of --data synthetic: each split its own images, --hflip 0 no
    mirroring on either path, and the per-channel mean and std of the training images."""
    args = argparse.Namespace(data="synthetic", synthetic_size=100, image_size=8, hflip=0.0)
    train_set, val_set, info = data_module.build_dataset(args)
    for part, length, split in ((train_set, 100, "train"), (val_set, 20, "val")):
        made = data_module.SyntheticImages(length, 8, split=split)
        assert torch.equal(part.images, made.images) and torch.equal(part.labels, made.labels)
    assert info.hflip == 0.0
    assert [type(step).__name__ for step in train_set.transform.transforms] == ["RandomCrop"]
    images = train_set.images.double()
    assert info.mean == pytest.approx(images.mean((0, 2, 3)).tolist(), rel=1e-6)
    assert info.std == pytest.approx(images.std((0, 2, 3)).tolist(), rel=1e-6)


@pytest.fixture(scope="module")
def ddp_data_module(template, tmp_path_factory):
    project = tmp_path_factory.mktemp("device-ddp") / "p"
    render(template, project, distributed="ddp", package_name="ddpproj")
    with inside(project):
        yield (
            importlib.import_module("ddpproj.data"),
            importlib.import_module("ddpproj.device_data"),
        )


def shares_by_epoch(module, make, epochs=3, world_size=2) -> list[list]:
    """[epoch][rank] -> the batches or samples of that process, in order."""
    shares = []
    for epoch in range(epochs):
        shares.append([])
        for rank in range(world_size):
            with as_process(module, rank, world_size):
                data = make()
            data.set_epoch(epoch)
            shares[-1].append(list(data))
    return shares


def assert_a_new_partition_each_epoch(orders: list[list[list[int]]], length: int) -> None:
    for epoch in orders:
        assert sorted(i for share in epoch for i in share) == list(range(length))
    for rank in range(len(orders[0])):
        by_epoch = [tuple(epoch[rank]) for epoch in orders]
        assert len(set(by_epoch)) == len(by_epoch), f"rank {rank} repeats an epoch's order"


def test_ddp_processes_shuffle_anew_each_epoch(ddp_data_module):
    """Under DDP each process's share of the training set (the loader's sampler and the
    on-device set) is a new draw every epoch, and the processes together see every sample
    once per epoch."""
    length = 100
    data, device_data = ddp_data_module
    samplers = shares_by_epoch(data, lambda: data.TrainSampler(length, 5))
    assert_a_new_partition_each_epoch(
        [[[index for index, _ in share] for share in epoch] for epoch in samplers], length
    )
    seeds = [{seed for _, seed in epoch[0]} for epoch in samplers]  # new augmentation draws
    assert not seeds[0] & seeds[1]
    images = torch.zeros(length, 1, 8, 8, dtype=torch.uint8)
    labels = torch.arange(length)
    cpu = torch.device("cpu")
    device_sets = shares_by_epoch(
        device_data, lambda: device_data.DeviceData(images, labels, 10, 5, 0.0, cpu)
    )
    assert_a_new_partition_each_epoch(
        [[torch.cat([y for _, y in share]).tolist() for share in epoch] for epoch in device_sets],
        length,
    )


def shuffled(labels: torch.Tensor, seed: int, epoch: int, loader: bool) -> list[list[int]]:
    """The labels in batches of 16, in the order that (seed, epoch) fixes: a permutation drawn
    from a generator seeded with seed * 100_003 + epoch, after the augmentation seeds of each
    item on the loader path (the sampler draws those first)."""
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    if loader:
        torch.randint(2**62, (len(labels),), generator=gen)
    return labels[torch.randperm(len(labels), generator=gen)].view(-1, 16).tolist()


@pytest.mark.parametrize("on_device", ["on", "off"])
def test_the_training_loop_starts_each_epoch_with_a_new_order(template, tmp_path, on_device):
    """train.py tells its sampler (or on-device set) --seed and the epoch: the targets of its
    batches are, in order, those of the shuffle that (seed, epoch) fixes, new each epoch."""
    project = render(template, tmp_path / "p")
    epochs = []
    with inside(project):
        import train
        from proj.data import SyntheticImages

        labels = SyntheticImages(64, 8).labels

        real = train.train_one_epoch

        def recording(parts, run, *args):
            epochs.append([targets.tolist() for _, targets in run.batches])
            return real(parts, run, *args)

        train.train_one_epoch = recording
        flags = ["--device", "cpu", "--synthetic-size", "64", "--image-size", "8"]
        flags += ["--batch-size", "16", "--epochs", "3", "--workers", "0", "--model", "mlp"]
        flags += ["--seed", "5", "--data-on-device", on_device]
        train.main([*flags, "--out-dir", str(tmp_path / "o")])
    assert epochs == [shuffled(labels, 5, epoch, on_device == "off") for epoch in range(3)]
    assert len({str(order) for order in epochs}) == 3, "an epoch repeated another's order"
