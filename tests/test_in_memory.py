"""The in-memory path of data: tensors projects: a training set held as tensors (the built-in
signals, a TensorDataset) is cut into whole batches by indexing, in the order the loader
path would load it; processes share it as the sampler does; a run stopped part-way resumes
bit for bit; float64 (NumPy's default) reaches the model as float32."""

from __future__ import annotations

import importlib
import unittest.mock

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from tests.helpers import inside, read_metrics, render
from tests.test_device_data import as_process
from tests.test_resume import checkpoint_step, same_training, stop_at_step

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    extras = ["preemption", "guard", "finders", "ema"]
    return render(template, tmp_path_factory.mktemp("mem") / "p", data="tensors", extras=extras)


@pytest.fixture(scope="module")
def modules(project):
    with inside(project):
        yield importlib.import_module("proj.data"), importlib.import_module("train")


@pytest.fixture(scope="module")
def ddp_data(template, tmp_path_factory):
    project = tmp_path_factory.mktemp("mem-ddp") / "p"
    render(template, project, data="tensors", distributed="ddp", package_name="memproj", extras=[])
    with inside(project):
        yield importlib.import_module("memproj.data")


class ItemByItem(Dataset):
    """The same items, without `tensors`: the loader path."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i]


def loaders(modules, train_set, *flags, val_set=None):
    data, train = modules
    args = train.get_args_parser().parse_args(["--seed", "7", "--batch-size", "8", *flags])
    info = data.DataInfo(num_classes=5, input_shape=(1, 6))
    return data.build_loaders(train_set, val_set or train_set, info, args, CPU)


def batches_of(train, sampler, epoch, start=0):
    sampler.set_epoch(epoch, start)
    return [(x.clone(), y.clone()) for x, y in train]


def test_whole_batches_are_the_loader_paths_batches(modules):
    """For each epoch the indexed batches equal, one for one, what the per-item loader
    yields for the same seed; started part-way (a resume), the rest of the same epoch."""
    data, _ = modules
    inputs, targets = torch.randn(61, 1, 6), torch.arange(61) % 5
    train_set = TensorDataset(inputs, targets)
    fast, val_loader, fast_sampler = loaders(modules, train_set, "--workers", "2")
    assert isinstance(fast, data.MemoryBatches) and len(fast) == 7  # 61 // 8, the rest dropped
    assert val_loader.num_workers == 0  # in memory: no loader processes
    with unittest.mock.patch.object(data, "cpu_count", return_value=2):
        other, val_loader, _ = loaders(modules, ItemByItem(train_set), "--workers", "2")
        assert other.num_workers == 2 and val_loader.num_workers == 2  # neither in memory
        other, val_loader, _ = loaders(
            modules, ItemByItem(train_set), "--workers", "2", val_set=train_set
        )
        assert other.num_workers == 2 and val_loader.num_workers == 0
    slow, _, slow_sampler = loaders(modules, ItemByItem(train_set), "--workers", "0")
    assert isinstance(slow, torch.utils.data.DataLoader)
    for epoch in (0, 3):
        expected = batches_of(slow, slow_sampler, epoch)
        got = batches_of(fast, fast_sampler, epoch)
        assert len(got) == len(expected) == 7
        for (x, y), (x_expected, y_expected) in zip(got, expected, strict=True):
            assert torch.equal(x, x_expected) and torch.equal(y, y_expected)
        gen = torch.Generator().manual_seed(7 * 100_003 + epoch)  # (seed, epoch) fix it
        torch.randint(2**62, (61,), generator=gen)  # the loader's per-item seeds come first
        order = torch.randperm(61, generator=gen)
        for b, (x, y) in enumerate(got):
            chosen = order[8 * b : 8 * b + 8]
            assert torch.equal(x, inputs[chosen]) and torch.equal(y, targets[chosen])
        rest = batches_of(fast, fast_sampler, epoch, start=3 * 8)
        assert len(fast) == 4 and all(
            torch.equal(x, a) and torch.equal(y, b)
            for (x, y), (a, b) in zip(rest, got[3:], strict=True)
        )
    first, second = (batches_of(fast, fast_sampler, e)[0][1] for e in (0, 1))
    assert not torch.equal(first, second)  # a new order each epoch


def test_the_processes_share_the_set_as_the_sampler_does(ddp_data):
    """Two processes: disjoint shares that together are every item once, each share the
    sampler's own (the loader path's), a new split each epoch."""
    inputs, targets = torch.randn(48, 1, 6), torch.arange(48)
    seen = {}
    for epoch in (0, 1):
        for rank in (0, 1):
            with as_process(ddp_data, rank, 2):
                sampler = ddp_data.TrainSampler(48, 7)
                batches = ddp_data.MemoryBatches(inputs, targets, 4, sampler, CPU)
            sampler.set_epoch(epoch)
            share = torch.cat([y for _, y in batches]).tolist()
            assert share == [index for index, _ in sampler]
            assert all(torch.equal(x, inputs[y]) for x, y in batches)
            seen[epoch, rank] = share
        assert sorted(seen[epoch, 0] + seen[epoch, 1]) == list(range(48))
    assert seen[0, 0] != seen[1, 0]


def test_float64_inputs_and_targets_reach_the_model_as_float32(modules, tmp_path):
    """A TensorDataset of float64 (NumPy's default) trains, in batches of float32; a
    regression's float64 targets become float32 too."""
    data, train = modules
    inputs = torch.randn(64, 1, 6, dtype=torch.float64)
    train_set = TensorDataset(inputs, torch.arange(64) % 5)
    fast, val_loader, sampler = loaders(modules, train_set)
    info = data.DataInfo(num_classes=5, input_shape=(1, 6))
    for batches in (fast, val_loader):
        x, y = next(iter(data.DeviceBatches(batches, info, CPU)))
        assert x.dtype == torch.float32 and y.dtype == torch.int64
    batches = data.DeviceBatches(None, info, CPU)
    x, y = batches.prepare(inputs[:4], inputs[:4, 0, 0])
    assert x.dtype == y.dtype == torch.float32 and torch.equal(x, inputs[:4].float())
    for half in (torch.float16, torch.bfloat16):  # as the model's weights are
        x, _ = batches.prepare(inputs[:4].to(half), inputs[:4, 0, 0])
        assert x.dtype == torch.float32 and torch.equal(x, inputs[:4].to(half).float())

    def build(args):
        return train_set, TensorDataset(inputs[:16], torch.arange(16) % 5), info

    flags = ["--device", "cpu", "--epochs", "1", "--batch-size", "16", "--model", "cnn1d"]
    with unittest.mock.patch.object(train, "build_dataset", build):
        train.main([*flags, "--out-dir", str(tmp_path)])
    assert len(read_metrics(tmp_path)) == 1


class BagOfTokens(torch.nn.Module):
    """Token ids into an embedding, averaged; notes the dtypes of the inputs it is given."""

    def __init__(self, info):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.out = torch.nn.Linear(16, info.num_classes)
        self.seen: set[torch.dtype] = set()

    def forward(self, tokens):
        self.seen.add(tokens.dtype)
        return self.out(self.embed(tokens).mean(1))


@pytest.mark.parametrize("path", ["whole batches", "loader"])
def test_token_ids_reach_an_embedding_as_they_are(modules, tmp_path, path):
    """With DataInfo(dtype=torch.int64), token ids reach the model as int64 in the model's
    check, the batch-size search, training and evaluation, and it learns from them (the
    class: whether most of an item's 12 tokens are below 25)."""
    data, train = modules
    tokens = torch.randint(50, (1200, 12), generator=torch.Generator().manual_seed(0))
    targets = ((tokens < 25).sum(1) > 6).long()
    train_set = TensorDataset(tokens[:1000], targets[:1000])
    train_set = train_set if path == "whole batches" else ItemByItem(train_set)
    info = data.DataInfo(num_classes=2, input_shape=(12,), dtype=torch.int64)
    models = []

    def build_model(name, info):
        models.append(BagOfTokens(info))
        return models[-1]

    def build(args):
        return train_set, TensorDataset(tokens[1000:], targets[1000:]), info

    flags = [
        "--device",
        "cpu",
        "--epochs",
        "15",
        "--lr",
        "2",
        "--batch-size",
        "auto",
        "--workers",
        "0",
    ]
    with (
        unittest.mock.patch.object(train, "build_dataset", build),
        unittest.mock.patch.object(train, "build_model", build_model),
    ):
        train.main([*flags, "--out-dir", str(tmp_path)])
    assert models[0].seen == {torch.int64}
    assert read_metrics(tmp_path)[-1]["val_acc"] > 90
    # Normalised inputs are floats: a mean with an integer dtype is refused.
    problem = data.DataInfo(2, (12,), mean=(0.0,) * 12, std=(1.0,) * 12, dtype=torch.int64)
    with pytest.raises(data.DataError, match="its dtype is torch.int64"):
        data.check_info(train_set, problem, "tokens")


def test_a_run_stopped_part_way_resumes_bit_identically(modules, tmp_path):
    """The built-in signals, trained by whole batches of 16 in windows of 2 (5 batches, 3
    optimizer steps an epoch), stopped after step 2 (its own SIGUSR1, at batch 4 of 5) and
    resumed: the same weights, optimizer and metrics as an unbroken run."""
    _, train = modules
    flags = ["--device", "cpu", "--synthetic-size", "80", "--epochs", "2"]  # CPU kernels: exact
    flags += ["--batch-size", "16", "--log-interval", "1", "--accum-steps", "2"]
    whole, out = tmp_path / "whole", tmp_path / "stopped"
    train.main([*flags, "--out-dir", str(whole)])
    stop_at_step(train, [*flags, "--out-dir", str(out)], 2)
    assert checkpoint_step(out / "last.pt") == 2
    train.main([*flags, "--out-dir", str(out)])
    same_training(whole / "last.pt", out / "last.pt")


def test_the_loader_path_with_workers_and_dropout_resumes_bit_identically(modules, tmp_path):
    """Item by item, with a loader process and a model with dropout (it draws from the global
    RNG), stopped in the second epoch and resumed: the same training as an unbroken run. The
    loaders' workers draw nothing from that RNG, the validation loader's either, which starts
    its workers at its first use: after the checkpoint in the stopped run, before it in the
    unbroken one."""
    _, train = modules
    flags = ["--device", "cpu", "--synthetic-size", "80", "--epochs", "3", "--workers", "1"]
    flags += ["--batch-size", "16", "--log-interval", "1", "--model", "mlp"]
    built = train.build_dataset

    def build(args):
        train_set, val_set, info = built(args)
        return ItemByItem(train_set), ItemByItem(val_set), info

    def with_dropout(name, info):
        hidden = torch.nn.Linear(64, 32)
        return torch.nn.Sequential(
            torch.nn.Flatten(), hidden, torch.nn.ReLU(), torch.nn.Dropout(0.3),
            torch.nn.Linear(32, info.num_classes),
        )  # fmt: skip

    whole, out = tmp_path / "whole", tmp_path / "stopped"
    with (
        unittest.mock.patch.object(train, "build_dataset", build),
        unittest.mock.patch.object(train, "build_model", with_dropout),
    ):
        train.main([*flags, "--out-dir", str(whole)])
        stop_at_step(train, [*flags, "--out-dir", str(out)], 7)  # epoch 2: 5 steps an epoch
        assert checkpoint_step(out / "last.pt") == 7
        train.main([*flags, "--out-dir", str(out)])
    same_training(whole / "last.pt", out / "last.pt")


def test_every_target_is_checked_before_training(modules):
    """The loader checks each batch's targets as it makes it; whole batches are checked
    all at once, before the first: a label past the classes anywhere is one line."""
    data, _ = modules
    targets = torch.arange(200) % 5
    targets[77] = 5  # outside the 64 items check_info samples
    with pytest.raises(data.DataError) as error:
        loaders(modules, TensorDataset(torch.randn(200, 1, 6), targets))
    assert str(error.value) == (
        "data set 'synthetic': target 5, where the default cross-entropy takes class "
        "indices: int64 from 0 to 4 (DataInfo.num_classes is 5)"
    )
    inputs = torch.randn(200, 1, 6)
    inputs[77, 0, 3] = torch.inf  # so are inputs that are not finite
    with pytest.raises(data.DataError) as error:
        loaders(modules, TensorDataset(inputs, torch.arange(200) % 5))
    assert str(error.value) == "data set 'synthetic': NaN or inf in its inputs"
