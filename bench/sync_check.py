"""Run a rendered project's train.py with CUDA's sync debug mode on inside
train_one_epoch, and list every host-device synchronisation made there.

    python bench/sync_check.py PROJECT [train.py flags]   (use a huge --log-interval)

PyTorch warns at each synchronising call (a blocking copy, .item(), nonzero, ...); each
warning's Python stack is recorded, so one run names every place that waits for the
device, in train.py and in PyTorch alike. Exit status 1 if there is any.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings

import torch

MESSAGE = "synchronizing CUDA operation"


def main() -> int:
    project = os.path.abspath(sys.argv[1])
    os.chdir(project)
    sys.path.insert(0, project)
    import train

    train_one_epoch = train.train_one_epoch
    sites: dict[tuple, list] = {}  # call site -> [count, stack]
    show = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if MESSAGE not in str(message):
            return show(message, category, filename, lineno, file, line)
        stack = [f for f in traceback.extract_stack()[:-1] if f.filename != warnings.__file__]
        key = tuple((frame.filename, frame.lineno) for frame in stack[-8:])
        sites.setdefault(key, [0, stack])[0] += 1

    def checked(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = record
                return train_one_epoch(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    train.train_one_epoch = checked
    train.main(sys.argv[2:])
    if not sites:
        print("no host sync inside train_one_epoch")
        return 0
    print(f"{len(sites)} places inside train_one_epoch wait for the device:")
    for count, stack in sites.values():
        print(f"--- {count} times, at:")
        print("".join(traceback.format_list(stack[-8:])), end="")
    return 1


if __name__ == "__main__":
    sys.exit(main())
