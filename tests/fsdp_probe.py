"""Run a script (a project's train.py, or tests/ddp_runner.py) with probes that record what
the FSDP tests compare, each process into PROBE_DIR/<project folder>.<RANK>.jsonl:

- "state": at the first optimizer step, the bytes this process holds of the weights, their
  gradients and the optimizer's state, counted from the local shards of sharded ones;
- "norm": each total gradient norm that clip_grad_norm_ returns (the whole norm, also when
  the gradients are sharded);
- "write": the name of each file written whole in place of another (os.replace: the
  checkpoints' files and metrics.csv);
- "dtypes": the dtypes of what the linear layers computed, at the end of the run;
- "sharded": at each fully_shard call, the devices of the module's parameters (meta: the
  model was sharded before it had weights);

and, from the first process, <project>.loaded.pt: the weights and the optimizer's state as
a resume loaded them from sharded checkpoint (set_state_dict), whole.

    python tests/fsdp_probe.py SCRIPT [ARGS...]          # under torchrun too
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint.state_dict as dcp_state_dict
import torch.distributed.fsdp as fsdp
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_post_hook

RANK = os.environ.get("RANK", "0")
dtypes: dict[str, set] = {}


def record(kind: str, **values) -> None:
    project = Path.cwd().name
    with open(Path(os.environ["PROBE_DIR"]) / f"{project}.{RANK}.jsonl", "a") as f:
        f.write(json.dumps({"kind": kind, **values}) + "\n")


def local_bytes(tensors) -> int:
    tensors = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in tensors)


counted: set[str] = set()


def count_state(optimizer, args, kwargs) -> None:
    if Path.cwd().name in counted:
        return
    counted.add(Path.cwd().name)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params if p.grad is not None]
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    state = [v for v in state if v.ndim > 0]  # not the step counters
    record(
        "state", params=local_bytes(params), grads=local_bytes(grads), optimizer=local_bytes(state)
    )


def watch(module, inputs, output) -> None:
    if isinstance(module, nn.Linear):
        dtypes.setdefault(Path.cwd().name, set()).add(str(output.dtype))


real_clip = nn.utils.clip_grad_norm_


def clip_logged(parameters, max_norm, *args, **kwargs):
    norm = real_clip(parameters, max_norm, *args, **kwargs)
    whole = norm.full_tensor() if isinstance(norm, DTensor) else norm
    record("norm", value=whole.item())
    return norm


real_replace = os.replace


def replace_logged(source, target, *args, **kwargs) -> None:
    real_replace(source, target, *args, **kwargs)
    record("write", name=Path(target).name)


real_set_state_dict = dcp_state_dict.set_state_dict


def set_state_dict_saved(model, optimizers, **kwargs):
    real_set_state_dict(model, optimizers, **kwargs)
    whole = dcp_state_dict.StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, optimizer = dcp_state_dict.get_state_dict(model, optimizers, options=whole)
    if RANK == "0":  # whole on the first process, empty on the others
        loaded = Path(os.environ["PROBE_DIR"]) / f"{Path.cwd().name}.loaded.pt"
        torch.save({"model": weights, "optimizer": optimizer}, loaded)


real_fully_shard = fsdp.fully_shard


@functools.wraps(real_fully_shard)  # with its attributes (fully_shard.state)
def fully_shard_recorded(module, *args, **kwargs):
    record("sharded", devices=sorted({p.device.type for p in module.parameters()}))
    return real_fully_shard(module, *args, **kwargs)


def report() -> None:
    for project, seen in dtypes.items():
        with open(Path(os.environ["PROBE_DIR"]) / f"{project}.{RANK}.jsonl", "a") as f:
            f.write(json.dumps({"kind": "dtypes", "values": sorted(seen)}) + "\n")


def main() -> None:
    script, *args = sys.argv[1:]
    register_optimizer_step_post_hook(count_state)
    nn.modules.module.register_module_forward_hook(watch)
    nn.utils.clip_grad_norm_ = clip_logged
    os.replace = replace_logged
    dcp_state_dict.set_state_dict = set_state_dict_saved
    fsdp.fully_shard = fully_shard_recorded
    atexit.register(report)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
