"""How the loader path is set up (workers capped by the CPUs, persistent workers and
prefetching, pinned memory only on CUDA, batches that cross to the device as uint8 without
blocking) and what --deterministic switches (cudnn.benchmark and TF32 off, deterministic
algorithms on). On a CPU these choices give the same numbers either way: the loaders the
code builds and the copies it makes are watched instead."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
import unittest.mock

import pytest
import torch

from tests.helpers import inside, render, run, train


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
        # Validation: the same workers, batches twice as large (no gradients to hold).
        assert (val_loader.num_workers, val_loader.batch_size) == (2, 16)
        alone, _, _ = data.build_loaders(train_set, val_set, info, loader_args("0"), cpu)
        assert alone.num_workers == 0 and not alone.persistent_workers
        # On CUDA both loaders pin their batches, for asynchronous copies to the GPU (the
        # loaders are only built here: nothing touches a GPU).
        with unittest.mock.patch.object(data, "cpu_count", return_value=2):
            cuda = torch.device("cuda")
            train_loader, val_loader, _ = data.build_loaders(
                train_set, val_set, info, loader_args(), cuda
            )
        assert train_loader.pin_memory and val_loader.pin_memory


def test_batches_cross_to_the_device_as_uint8_without_blocking(project, monkeypatch):
    """The loader's uint8 images cross to the device as they are (a quarter of float32's
    bytes), copied with non_blocking=True (asynchronous from pinned memory), and become
    normalised floats there."""
    copies, real_to = [], torch.Tensor.to

    def to(tensor, *args, **kwargs):
        copies.append((tensor.dtype, args, kwargs))
        return real_to(tensor, *args, **kwargs)

    with inside(project):
        data = importlib.import_module("proj.data")
        info = data.DataInfo(10, (3, 8, 8), mean=(60.0, 120.0, 180.0), std=(30.0, 60.0, 90.0))
        cpu = torch.device("cpu")
        images = torch.randint(256, (4, 3, 8, 8), dtype=torch.uint8)
        batches = data.DeviceBatches([(images, torch.arange(4))], info, cpu, False)
        monkeypatch.setattr(torch.Tensor, "to", to)
        [(inputs, targets)] = list(batches)
        monkeypatch.undo()
    sent = {"non_blocking": True}
    assert copies == [(torch.uint8, (cpu,), sent), (torch.int64, (cpu,), sent)]
    assert inputs.dtype == torch.float32 and torch.equal(targets, torch.arange(4))


def test_ddp_processes_of_a_machine_share_its_cpus(template, tmp_path, monkeypatch):
    """Under DDP --workers is per process, capped by this machine's CPUs over this machine's
    processes (LOCAL_WORLD_SIZE), however many machines there are: 2 machines of 2
    processes, 4 CPUs each, give each process 2 workers at most."""
    project = render(template, tmp_path / "p", distributed="ddp")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with inside(project):
        data = importlib.import_module("proj.data")
        train_set = data.SyntheticImages(32, size=8)
        val_set = data.SyntheticImages(16, size=8, split="val")
        cpu = torch.device("cpu")
        with unittest.mock.patch.object(data, "cpu_count", return_value=4):
            for workers, expected in (("4", 2), ("1", 1)):
                loader, _, _ = data.build_loaders(
                    train_set, val_set, None, loader_args(workers), cpu
                )
                assert loader.num_workers == expected, workers


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
def test_deterministic_switches_off_the_fast_nondeterministic_kernels(
    project, deterministic, monkeypatch
):
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.backends.cuda.matmul.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.allow_tf32,
    )
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        with inside(project):
            utils = importlib.import_module("proj.utils")
            utils.seed_everything(3, deterministic)
        assert torch.backends.cudnn.benchmark is not deterministic  # fixed shapes: fastest
        assert torch.backends.cudnn.deterministic is deterministic
        assert torch.backends.cuda.matmul.allow_tf32 is not deterministic
        assert torch.backends.cudnn.allow_tf32 is not deterministic
        assert torch.are_deterministic_algorithms_enabled() is deterministic
        # cuBLAS is reproducible only with a fixed workspace, read when its first handle is made.
        expected = ":4096:8" if deterministic else None
        assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == expected
        assert torch.initial_seed() == 3
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[:2]
        torch.backends.cuda.matmul.allow_tf32 = saved[2]
        torch.use_deterministic_algorithms(saved[3])
        torch.backends.cudnn.allow_tf32 = saved[4]


@pytest.mark.parametrize("deterministic", [False, True])
def test_only_deterministic_runs_import_the_compiler_at_start(template, tmp_path, deterministic):
    """torch.use_deterministic_algorithms imports torch's compiler stack (a second or more of
    CPU): a run that did not ask for determinism must not pay it. A project without
    torchvision (which imports the compiler itself) shows it, in a fresh interpreter."""
    project = render(template, tmp_path / "p", data="tensors", extras=[])
    code = (
        "import sys; from proj.utils import seed_everything; "
        f"seed_everything(0, {deterministic}); print('torch._dynamo' in sys.modules)"
    )
    out = run(sys.executable, "-c", code, cwd=project).stdout.split()
    assert out == [str(deterministic)]


def test_no_tqdm_thread_starts_as_the_loaders_fork_their_workers(project, tmp_path):
    """A thread that starts or ends just as a process forks can leave the child hung in the
    fork (CPython's runtime locks). A tqdm bar starts a monitor thread unless told not to,
    right before its epoch's loader forks its workers, and the thread ends within seconds
    once no bar is left: a resumed DDP run with loader workers once hung so. At each fork of
    a run with loader workers, no tqdm thread is alive."""
    at_forks = []
    watching = [True]  # register_at_fork cannot be undone: the hook outlives the test

    def record():
        if watching:
            at_forks.append(sorted(t.name for t in threading.enumerate() if "tqdm" in t.name))

    os.register_at_fork(before=record)
    try:
        flags = ["--synthetic-size", "64", "--image-size", "8", "--batch-size", "16"]
        flags += ["--data-on-device", "off", "--workers", "2", "--epochs", "2"]
        train(project, *flags, "--out-dir", str(tmp_path))
    finally:
        watching.clear()
    assert at_forks == [[]] * 4  # two workers of the training loader, two of validation's
