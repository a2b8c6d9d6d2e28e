"""FSDP2 (distributed: fsdp) with real torchrun processes over gloo: the same training as DDP
with half the state in each of two processes, sharded checkpoints that resume bit for bit
and on another number of processes, and every fsdp render clean."""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import re
import runpy
import shutil
import signal
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.state_dict as dcp_state_dict

from tests.helpers import OPTIMIZERS, inside, read_metrics, render, ruff, run
from tests.test_matrix import check_nothing_left_out
from tests.test_resume import interrupt_at, tensors_equal, without_speed

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
TESTS = Path(__file__).parent
PROBE, RUNNER = str(TESTS / "fsdp_probe.py"), str(TESTS / "ddp_runner.py")
QUICK = ["--device", "cpu", "--synthetic-size", "48", "--image-size", "8", "--workers", "0"]
QUICK += ["--batch-size", "8"]
FSDP_SCHEDULERS = ("warmup_cosine", "onecycle", "cyclic", "cosine_restarts", "step", "constant")
FSDP_EXTRAS = ([], ["preemption"], ["tensorboard"], ["preemption", "tensorboard"])


def probes(folder: Path, project: str, rank: int, kind: str) -> list[dict]:
    lines = (folder / f"{project}.{rank}.jsonl").read_text().splitlines()
    return [entry for entry in map(json.loads, lines) if entry["kind"] == kind]


def read_shards(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a torch.distributed.checkpoint folder, whole, by its flat name, read
    here in one process from what the folder says of itself."""
    saved = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    tensors = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in saved.items()
        if hasattr(meta, "size")
    }
    dcp.load(tensors, checkpoint_id=folder)
    return tensors


def shards_of(pointer: Path) -> dict[str, torch.Tensor]:
    return read_shards(pointer.parent / torch.load(pointer, weights_only=True)["shards"])


# Each optimizer once, amp alternating (bf16 with images, off with tensors: two sets of
# flags), the schedules and extras spread over them.
COVER = [
    dict(
        optimizer=optimizer,
        amp=("off", "bf16")[i % 2],
        scheduler=FSDP_SCHEDULERS[i % len(FSDP_SCHEDULERS)],
        data=("tensors", "images")[i % 2],
        extras=FSDP_EXTRAS[i % len(FSDP_EXTRAS)],
    )
    for i, optimizer in enumerate(OPTIMIZERS)
]


@pytest.fixture(scope="module")
def fsdp_renders(template, tmp_path_factory):
    """Every amp x optimizer x schedule that FSDP takes (as the DDP matrix renders them),
    the data and the extras spread over them."""
    folder = tmp_path_factory.mktemp("fsdp-renders")
    projects = {}
    combinations = itertools.product(("off", "bf16"), OPTIMIZERS, FSDP_SCHEDULERS)
    for i, (amp, optimizer, scheduler) in enumerate(combinations):
        answers = dict(
            optimizer=optimizer,
            amp=amp,
            scheduler=scheduler,
            data=("images", "tensors")[i % 2],
            extras=FSDP_EXTRAS[i // 2 % len(FSDP_EXTRAS)],
        )
        dest = folder / f"{amp}-{optimizer}-{scheduler}"
        projects[dest] = answers
        # Runs give --batch-size 8; an answer of 128 renders the batch of a short run too.
        batch_size = (8, 128)[i // 4 % 2]
        render(template, dest, distributed="fsdp", batch_size=batch_size, epochs=1, **answers)
    return projects


def test_every_fsdp_render_is_clean_and_holds_nothing_left_out(fsdp_renders):
    """ruff clean as rendered; nothing of what the answers left out, nothing of DDP's
    machinery, of autocast or of the flags that FSDP cannot honour (--compile,
    --channels-last); a module of its own that shards, named in train.py."""
    projects = list(fsdp_renders)
    assert ruff("check", "--no-cache", *projects).returncode == 0
    assert ruff("format", "--check", "--no-cache", *projects).returncode == 0
    for project, answers in fsdp_renders.items():
        check_nothing_left_out(project, {"distributed": "fsdp", **answers})
        assert (project / "proj/sharding.py").is_file()
        assert (project / "scripts/launch.sh").is_file()
        assert (project / "scripts/slurm.sbatch").is_file()
        for path in project.rglob("*.py"):
            assert not re.search(r"\bDDP\b", path.read_text()), path
        train_py = (project / "train.py").read_text()
        assert "shard_model(raw_model, sharding_units(raw_model)" in train_py
        assert "set_requires_gradient_sync(i == window - 1)" in train_py


@pytest.mark.slow
def test_a_cover_of_fsdp_combinations_trains_on_two_processes(template, tmp_path):
    """Each optimizer once, in one torchrun job of two processes: each trains one epoch to
    a finite loss, and with --amp bf16 the linear layers compute in bfloat16 (FSDP's
    policy), else in float32."""
    projects = []
    for answers in COVER:
        dest = tmp_path / f"{answers['optimizer']}-{answers['amp']}"
        projects.append(render(template, dest, distributed="fsdp", epochs=1, **answers))
    (tmp_path / "probe").mkdir()
    results = tmp_path / "results.tsv"
    flags = ["--device", "cpu", "--synthetic-size", "48", "--workers", "0", "--batch-size", "8"]
    bf16 = [p for p, answers in zip(projects, COVER, strict=True) if answers["amp"] == "bf16"]
    off = [p for p in projects if p not in bf16]
    env = {**os.environ, "PROBE_DIR": str(tmp_path / "probe")}
    # --amp bf16 forced on the CPU; a project answered off has no --amp flag. One job.
    groups = [*bf16, "--", *flags, "--amp", "bf16", "--image-size", "8", "--", *off, "--", *flags]
    run(*TORCHRUN, PROBE, RUNNER, results, *groups, env=env, timeout=600)
    outcomes = dict(line.split("\t") for line in results.read_text().splitlines())
    assert outcomes == {str(p): "ok" for p in projects}
    for project in projects:
        (row,) = read_metrics(project / "runs/ddp")
        assert math.isfinite(row["train_loss"]) and math.isfinite(row["val_loss"]), project
        computed = probes(tmp_path / "probe", project.name, 0, "dtypes")[0]["values"]
        assert computed == (["torch.bfloat16"] if project in bf16 else ["torch.float32"])


@pytest.fixture(scope="module")
def twins(template, tmp_path_factory):
    """A DDP project and an FSDP one, of the same answers."""
    folder = tmp_path_factory.mktemp("twins")
    ddp = render(template, folder / "ddp", distributed="ddp", extras=["preemption"])
    fsdp = render(template, folder / "fsdp", distributed="fsdp", extras=["preemption"])
    return ddp, fsdp


@pytest.mark.slow
def test_fsdp_trains_as_ddp_with_half_the_state_per_process(twins, template, tmp_path):
    """The same seed, data and flags on two processes, by DDP and by FSDP, an MLP of 0.8 M
    parameters with accumulation (windows of 2) and clipping that bites. FSDP's is built on
    the meta device and sharded there (no process holds it whole), then each process makes
    its shards of the initial weights, which are DDP's: each step's total gradient norm, the
    epoch's losses and the weights after it are DDP's up to float32 rounding; each FSDP
    process holds half of DDP's weights, gradients and optimizer state (counted from its
    local shards at the first step). The first process alone writes checkpoints and
    metrics.csv, in both. LAMB and LARS, whose trust ratios take the norm of each whole
    weight (FSDP's shards hold a part), train there as under DDP too."""
    ddp, fsdp = twins
    layerwise = [
        render(template, tmp_path / f"{optimizer}-{distributed}", **answers)
        for optimizer in ("lamb", "lars")
        for distributed in ("ddp", "fsdp")
        for answers in [dict(distributed=distributed, optimizer=optimizer, extras=[])]
    ]
    flags = [*QUICK, "--image-size", "32", "--synthetic-size", "96", "--model", "mlp"]
    flags += ["--amp", "off", "--accum-steps", "2", "--clip-grad", "0.5", "--epochs", "1"]
    probe = tmp_path / "probe"
    probe.mkdir()
    env = {**os.environ, "PROBE_DIR": str(probe)}
    results = tmp_path / "results.tsv"
    projects = [ddp, fsdp, *layerwise]
    run(*TORCHRUN, PROBE, RUNNER, results, *projects, "--", *flags, env=env, timeout=300)
    assert results.read_text().count("\tok") == 6, results.read_text()

    for rank in (0, 1):
        norms = [[e["value"] for e in probes(probe, p.name, rank, "norm")] for p in twins]
        assert len(norms[0]) == 3 and min(norms[0]) > 0.5  # 3 steps, each one clipped
        assert norms[1] == pytest.approx(norms[0], rel=1e-5)
        (ddp_state,), (fsdp_state,) = (probes(probe, p.name, rank, "state") for p in twins)
        for part in ("params", "grads", "optimizer"):
            assert ddp_state[part] > 3_000_000  # bytes: 0.79 M float32 numbers
            assert fsdp_state[part] / ddp_state[part] == pytest.approx(0.5, abs=0.01), part
        # Built on the meta device: no process held the whole model, nor any weight.
        sharded = [e["devices"] for e in probes(probe, fsdp.name, rank, "sharded")]
        assert sharded == [["meta"], ["meta"]]  # the MLP's layers (one unit), then the root
        assert probes(probe, ddp.name, rank, "sharded") == []
        writes = [[e["name"] for e in probes(probe, p.name, rank, "write")] for p in twins]
        if rank == 0:
            for names in writes:
                assert {"last.pt", "best.pt", "metrics.csv"} <= set(names), names
        else:
            assert writes == [[], []]
    (ddp_row,), (fsdp_row,) = (read_metrics(p / "runs/ddp") for p in twins)
    for column in ("train_loss", "val_loss", "val_acc"):
        assert fsdp_row[column] == pytest.approx(ddp_row[column], rel=1e-5), column
    ddp_weights = torch.load(ddp / "runs/ddp/last.pt", weights_only=True)["model"]
    fsdp_weights = shards_of(fsdp / "runs/ddp/last.pt")
    assert {f"model.{name}" for name in ddp_weights} <= set(fsdp_weights)
    for name, tensor in ddp_weights.items():
        torch.testing.assert_close(fsdp_weights[f"model.{name}"], tensor, rtol=1e-5, atol=1e-6)
    assert not torch.equal(fsdp_weights["model.net.1.weight"], ddp_weights["net.1.weight"] * 0)
    for ddp_project, fsdp_project in zip(layerwise[::2], layerwise[1::2], strict=True):
        (ddp_row,), (fsdp_row,) = (
            read_metrics(p / "runs/ddp") for p in (ddp_project, fsdp_project)
        )
        assert fsdp_row["train_loss"] == pytest.approx(ddp_row["train_loss"], rel=1e-5)
        ddp_weights = torch.load(ddp_project / "runs/ddp/last.pt", weights_only=True)["model"]
        fsdp_weights = shards_of(fsdp_project / "runs/ddp/last.pt")
        for name, tensor in ddp_weights.items():
            torch.testing.assert_close(fsdp_weights[f"model.{name}"], tensor, rtol=1e-5, atol=1e-6)


def test_models_built_on_meta_and_sharded_start_as_built_whole(twins):
    """In a process group of one, each built-in model built on the meta device and given its
    initial weights shard by shard (shard_model) holds the weights and BatchNorm statistics
    that building it whole from the same seed gives, bit for bit (ResNetSmall's convolutions
    He-initialised, each block's last norm zeroed, after the layers' own initialisation). A
    user's model with a weight that no reset_parameters() sets stops, naming the weight;
    given a method init_weights(module) that sets it, it starts as built whole."""
    _, fsdp = twins
    with inside(fsdp):
        from proj.data import DataInfo
        from proj.distributed import init_distributed
        from proj.models import MODELS, build_model, sharding_units
        from proj.sharding import shard_model
        from proj.utils import UserError

        device, _, _ = init_distributed("cpu")
        info = DataInfo(10, (3, 8, 8))
        for name in MODELS:
            torch.manual_seed(7)
            whole = build_model(name, info).state_dict()
            torch.manual_seed(0)  # shard_model draws from the seed it is given alone
            with torch.device("meta"):
                model = build_model(name, info)
            shard_model(model, sharding_units(model), device, 7, None)
            whole_options = dcp_state_dict.StateDictOptions(full_state_dict=True)
            made = dcp_state_dict.get_model_state_dict(model, options=whole_options)
            assert made.keys() == whole.keys(), name
            for key, tensor in whole.items():
                assert torch.equal(made[key], tensor), (name, key)

        class Scaled(torch.nn.Module):  # a weight of its own, and no reset_parameters()
            def __init__(self) -> None:
                super().__init__()
                self.linear = torch.nn.Linear(4, 4)
                self.scale = torch.nn.Parameter(torch.ones(4))

        with torch.device("meta"):
            model = Scaled()
        with pytest.raises(UserError, match="^scale has no initial value: give its module"):
            shard_model(model, [], device, 0, None)

        class Drawn(Scaled):  # the builder sets it, through the model's init_weights
            def __init__(self) -> None:
                super().__init__()
                for module in self.modules():
                    self.init_weights(module)

            def init_weights(self, module: torch.nn.Module) -> None:
                if module is self:
                    torch.nn.init.normal_(self.scale)

        torch.manual_seed(7)
        whole = Drawn().state_dict()
        with torch.device("meta"):
            model = Drawn()
        shard_model(model, [model.linear], device, 7, None)
        made = dcp_state_dict.get_model_state_dict(model, options=whole_options)
        assert made.keys() == whole.keys()
        for key, tensor in whole.items():
            assert torch.equal(made[key], tensor), key


# 10 optimizer steps per epoch on 2 processes, 2 epochs: room to interrupt.
RUN = ["--deterministic", "--device", "cpu", "--synthetic-size", "160", "--image-size", "8"]
RUN += ["--batch-size", "8", "--epochs", "2", "--log-interval", "1", "--workers", "0"]


def same_sharded_training(done: Path, resumed: Path) -> None:
    """Two sharded checkpoints hold the same training, bit for bit: the weights and the
    optimizer's state in their shards, and the rest in the file that names them."""
    a, b = (torch.load(path, weights_only=True) for path in (done, resumed))
    for state in (a, b):
        del state["progress"]["elapsed_s"]
        state["progress"]["history"] = without_speed(state["progress"]["history"])
    for part in ("scheduler", "progress", "sums", "processes"):
        tensors_equal(a[part], b[part], part)
    tensors_equal(shards_of(done), shards_of(resumed), "shards")


def main_of(project: Path, *flags) -> None:
    """Run the project's train.py as a script in this process (helpers.train without the
    metrics)."""
    with inside(project):
        sys.argv = ["train.py", *map(str, flags)]
        runpy.run_path("train.py", run_name="__main__")


@pytest.mark.slow
def test_fsdp_preempted_then_resumed_is_bit_identical_and_loads_anywhere(
    twins, template, tmp_path, monkeypatch, capsys
):
    """On two processes, a run stopped by SIGTERM at step 4 (saved at step 5) and resumed
    ends with the weights, optimizer state, schedule, sums and metrics of a run that was
    not stopped, and its older shard folders are gone. Its last checkpoint then loads into
    one process (a group of one) with the weights and the optimizer's momentum that the two
    wrote; `python -m proj.sharding` writes those weights as one file, which a project
    that is not sharded and the sharded one evaluate alike (--init-weights), and which the
    sharded last.pt given to --init-weights is refused for, in one line naming that
    command."""
    _, fsdp = twins
    run(*TORCHRUN, "train.py", *RUN, "--out-dir", tmp_path / "whole", cwd=fsdp, timeout=300)
    out = tmp_path / "preempted"
    cmd = [*TORCHRUN, "train.py", *RUN, "--out-dir", str(out), "--save-every", "4"]
    assert interrupt_at(cmd, fsdp, 4, signal.SIGTERM, markers=2) != 0
    assert torch.load(out / "last.pt", weights_only=True)["progress"]["step"] == 5
    result = run(*cmd, cwd=fsdp, timeout=300)
    assert "resumed from" in result.stdout
    same_sharded_training(tmp_path / "whole/last.pt", out / "last.pt")
    assert without_speed(read_metrics(out)) == without_speed(read_metrics(tmp_path / "whole"))
    kept = sorted(p.name for p in out.iterdir() if p.is_dir())
    pointers = [torch.load(out / f"{n}.pt", weights_only=True)["shards"] for n in ("best", "last")]
    assert kept == sorted(pointers)

    loaded = {}
    real_set_state_dict = dcp_state_dict.set_state_dict

    def set_state_dict(model, optimizers, **kwargs):
        real_set_state_dict(model, optimizers, **kwargs)
        whole = dcp_state_dict.StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = dcp_state_dict.get_state_dict(model, optimizers, options=whole)
        # Copies: on one process, whole tensors on the CPU are the weights themselves.
        loaded.update(model=copy.deepcopy(state[0]), optimizer=copy.deepcopy(state[1]))

    monkeypatch.setattr(dcp_state_dict, "set_state_dict", set_state_dict)
    one = tmp_path / "one"
    main_of(fsdp, *RUN, "--epochs", "3", "--resume", out / "last.pt", "--out-dir", one)
    assert "1 x cpu" in capsys.readouterr().out
    written = shards_of(out / "last.pt")
    for name, tensor in loaded["model"].items():
        assert torch.equal(tensor, written[f"model.{name}"]), name
    momentum = {k: v["momentum_buffer"] for k, v in loaded["optimizer"]["state"].items()}
    assert len(momentum) == len([k for k in written if k.endswith(".momentum_buffer")]) > 0
    for name, tensor in momentum.items():
        assert torch.equal(tensor, written[f"optimizer.state.{name}.momentum_buffer"]), name
    assert [row["epoch"] for row in read_metrics(one)] == [1, 2, 3]

    weights = tmp_path / "weights.pt"
    with inside(fsdp), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")  # python -m proj.sharding CHECKPOINT OUT, here
        sys.argv = ["sharding", str(out / "last.pt"), str(weights)]
        runpy.run_module("proj.sharding", run_name="__main__")
    assert [str(w.message) for w in warned] == []  # none of torch's about one process
    exported = torch.load(weights, weights_only=True)["model"]
    assert {f"model.{k}" for k in exported} == {k for k in written if k.startswith("model.")}
    for name, tensor in exported.items():
        assert torch.equal(tensor, written[f"model.{name}"]), name
    # The README's Outputs: best-weights.pt, written as above, loads into the built model.
    shutil.copy(weights, fsdp / "best-weights.pt")
    text = (fsdp / "README.md").read_text().split("## Outputs\n", 1)[1].split("\n## ", 1)[0]
    assert "python -m proj.sharding runs/default/best.pt best-weights.pt" in " ".join(text.split())
    namespace = {}
    with inside(fsdp):
        exec(re.search(r"```python\n(.*?)```", text, flags=re.S)[1], namespace)
    for name, tensor in namespace["model"].state_dict().items():
        assert torch.equal(tensor, exported[name]), name
    single = render(template, tmp_path / "single", extras=[])
    main_of(single, *RUN, "--eval-only", "--init-weights", weights, "--out-dir", tmp_path / "s")
    evaluated = capsys.readouterr().out.strip().splitlines()[-1]
    assert evaluated.startswith("val_loss")
    main_of(fsdp, *RUN, "--eval-only", "--init-weights", weights, "--out-dir", tmp_path / "f")
    assert capsys.readouterr().out.strip().splitlines()[-1] == evaluated  # sharded from it
    with pytest.raises(SystemExit) as refused:
        main_of(fsdp, *RUN, "--init-weights", out / "last.pt", "--out-dir", tmp_path / "g")
    said = capsys.readouterr().err  # one line, written whole: each process's
    assert refused.value.code == 1 and said.startswith("error: ")  # no rank without torchrun
    assert "sharded; write its weights to one file first: python -m proj.sharding" in said


def test_a_save_cut_short_leaves_the_last_checkpoint_whole(twins, tmp_path, monkeypatch, capsys):
    """A process killed while it writes the shards of epoch 2's last.pt (here: the shards
    written but the folder's metadata not yet, then the process gone) leaves last.pt naming
    epoch 1's whole folder: it evaluates, and the run resumes from it, to a new folder; the
    save after that removes both the older folder and the one cut short. A last.pt naming
    the torn folder would be refused in one line."""
    _, fsdp = twins
    out = tmp_path / "o"
    flags = [*QUICK, "--epochs", "1", "--out-dir", out]
    main_of(fsdp, *flags)
    first = torch.load(out / "last.pt", weights_only=True)["shards"]
    real_save = dcp.save

    def killed(state, checkpoint_id):
        real_save(state, checkpoint_id=checkpoint_id)
        if Path(checkpoint_id).name.startswith("last."):
            (Path(checkpoint_id) / ".metadata").unlink()  # torn: never finished
            raise SystemExit("killed")

    monkeypatch.setattr(dcp, "save", killed)
    with pytest.raises(SystemExit, match="killed"):
        main_of(fsdp, *QUICK, "--epochs", "2", "--out-dir", out)
    monkeypatch.setattr(dcp, "save", real_save)
    assert torch.load(out / "last.pt", weights_only=True)["shards"] == first
    torn = [p for p in out.glob("last.*") if p.is_dir() and p.name != first]
    assert [(p / ".metadata").exists() for p in torn] == [False]
    main_of(fsdp, *QUICK, "--eval-only", "--out-dir", out)
    pointer = torch.load(out / "last.pt", weights_only=True)
    torch.save({**pointer, "shards": torn[0].name}, out / "torn.pt")  # as if it named it
    with pytest.raises(SystemExit) as refused:
        main_of(fsdp, *QUICK, "--eval-only", "--resume", out / "torn.pt", "--out-dir", tmp_path)
    whole = f"{torn[0]}: missing, or not whole (its save did not finish)\n"
    assert refused.value.code == 1 and capsys.readouterr().err.endswith(whole)
    main_of(fsdp, *QUICK, "--epochs", "2", "--out-dir", out)
    assert [row["epoch"] for row in read_metrics(out)] == [1, 2]
    last = torch.load(out / "last.pt", weights_only=True)["shards"]
    assert last not in (first, torn[0].name)
    assert sorted(p.name for p in out.glob("last.*") if p.is_dir()) == [last]
    # A run that read last.pt just before a save of the run training there replaced its folder.
    torch.save({**pointer, "shards": first}, out / "old.pt")
    with pytest.raises(SystemExit) as refused:
        main_of(fsdp, *QUICK, "--eval-only", "--resume", out / "old.pt", "--out-dir", tmp_path)
    replaced = f"{out / first}: replaced by a newer save as this run began; rerun\n"
    assert refused.value.code == 1 and capsys.readouterr().err.endswith(replaced)


@pytest.mark.slow
def test_fsdp_resumes_on_one_then_two_then_three_processes(twins, tmp_path, capsys):
    """A run of one process for epoch 1, resumed on two for epoch 2, then on three for epoch
    3 (ResNetSmall's first dimensions, 16, 32, 64 and 10, are not all split evenly in three):
    each resume loads the weights and the optimizer's momentum that the folder of shards
    holds, bit for bit, and goes on to a row of metrics. Its evaluation counts each of the 17
    validation items once (9 and 8 on two processes: 2 batches of 8 and 1, against 1; every
    forward gathers the weights, all processes together, so the one with a batch fewer runs
    its last again, uncounted): the metrics of the epoch are those that one process
    evaluates from the checkpoint."""
    _, fsdp = twins
    probe = tmp_path / "probe"
    probe.mkdir()
    env = {**os.environ, "PROBE_DIR": str(probe)}
    flags = [*QUICK, "--synthetic-size", "85", "--batch-size", "4"]
    main_of(fsdp, *flags, "--epochs", "1", "--out-dir", tmp_path / "1")
    for processes in (2, 3):
        # Each in a folder of its own: this process holds the lock of the first.
        resume, out = tmp_path / f"{processes - 1}/last.pt", tmp_path / str(processes)
        written = shards_of(resume)
        torchrun = [*TORCHRUN[:-1], f"--nproc-per-node={processes}", PROBE, "train.py"]
        more = ["--epochs", processes, "--resume", resume, "--out-dir", out]
        result = run(*torchrun, *flags, *more, cwd=fsdp, env=env, timeout=120)
        done = f"{processes - 1} epoch{'s' * (processes > 2)} done"
        assert f"resumed from {resume}: {done}, step " in result.stdout
        assert f"{processes} x cpu" in result.stdout
        loaded = torch.load(probe / "fsdp.loaded.pt", weights_only=True)
        assert {f"model.{k}" for k in loaded["model"]} == {k for k in written if k[:6] == "model."}
        for name, tensor in loaded["model"].items():
            assert torch.equal(tensor, written[f"model.{name}"]), (processes, name)
        momentum = {k: v["momentum_buffer"] for k, v in loaded["optimizer"]["state"].items()}
        assert len(momentum) == len([k for k in written if k.endswith(".momentum_buffer")]) > 0
        for name, tensor in momentum.items():
            key = f"optimizer.state.{name}.momentum_buffer"
            assert torch.equal(tensor, written[key]), (processes, name)
        rows = read_metrics(out)
        assert [row["epoch"] for row in rows] == list(range(1, processes + 1))
        capsys.readouterr()
        evaluate = ["--eval-only", "--resume", out / "last.pt", "--out-dir", tmp_path / "e"]
        main_of(fsdp, *flags, *evaluate)
        loss, acc = capsys.readouterr().out.strip().splitlines()[-1].split()[1:4:2]
        assert float(acc) == pytest.approx(rows[-1]["val_acc"], abs=1e-6)
        assert float(loss) == pytest.approx(rows[-1]["val_loss"], rel=1e-5)
