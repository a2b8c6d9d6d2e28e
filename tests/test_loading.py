"""How the loader path is set up (workers capped by the CPUs, persistent workers and
prefetching, pinned memory only on CUDA) and what --deterministic switches (cudnn.benchmark
and TF32 off, deterministic algorithms on)."""

from __future__ import annotations

import argparse
import importlib
import unittest.mock

import pytest
import torch

from tests.helpers import inside, render


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("loading") / "p")


def loader_args(workers_flag: str = "2") -> argparse.Namespace:
    workers = int(workers_flag)
    return argparse.Namespace(
        data="synthetic", batch_size=8, seed=0, data_on_device="off", workers=workers
    )


def test_loader_keeps_its_workers_and_pins_memory_only_on_cuda(project):
    with inside(project):
        data = importlib.import_module("proj.data")
        train_set = data.SyntheticImages(32, size=8)
        val_set = data.SyntheticImages(16, size=8, split="val")
        info = None  # read only by the on-device path
        cpu = torch.device("cpu")
        with unittest.mock.patch.object(data, "cpu_count", return_value=2):
            train_loader, val_loader, _ = data.build_loaders(
                train_set, val_set, info, loader_args(), cpu
            )
        assert train_loader.num_workers == 2 and train_loader.persistent_workers
        assert val_loader.num_workers == 2 and val_loader.persistent_workers  # between epochs
        assert train_loader.prefetch_factor == 4 and train_loader.drop_last
        assert not train_loader.pin_memory and not val_loader.pin_memory
        alone, _, _ = data.build_loaders(train_set, val_set, info, loader_args("0"), cpu)
        assert alone.num_workers == 0 and not alone.persistent_workers


def test_workers_are_capped_by_the_cpus(project, tmp_path, capsys):
    with inside(project):
        import train
        from proj.utils import cpu_count

        cpus = cpu_count()
        flags = ["--device", "cpu", "--synthetic-size", "32", "--image-size", "8"]
        flags += ["--batch-size", "16", "--epochs", "1", "--model", "mlp"]
        flags += ["--data-on-device", "off", "--workers", str(cpus + 1)]
        train.main([*flags, "--out-dir", str(tmp_path)])
    assert f"{cpus} loader workers" in capsys.readouterr().out


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_switches_off_the_fast_nondeterministic_kernels(project, deterministic):
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.backends.cuda.matmul.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
    )
    try:
        with inside(project):
            utils = importlib.import_module("proj.utils")
            utils.seed_everything(3, deterministic)
        assert torch.backends.cudnn.benchmark is not deterministic  # fixed shapes: fastest
        assert torch.backends.cudnn.deterministic is deterministic
        assert torch.backends.cuda.matmul.allow_tf32 is not deterministic
        assert torch.are_deterministic_algorithms_enabled() is deterministic
        assert torch.initial_seed() == 3
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[:2]
        torch.backends.cuda.matmul.allow_tf32 = saved[2]
        torch.use_deterministic_algorithms(saved[3])
