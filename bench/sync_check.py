"""Run a rendered project's train.py with CUDA's sync debug mode set to "error" inside
train_one_epoch: any host-device synchronisation there raises.

    python bench/sync_check.py PROJECT [train.py flags]   (use a huge --log-interval)
"""

from __future__ import annotations

import os
import sys

import torch


def main() -> None:
    project = os.path.abspath(sys.argv[1])
    os.chdir(project)
    sys.path.insert(0, project)
    import train

    train_one_epoch = train.train_one_epoch

    def checked(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return train_one_epoch(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    train.train_one_epoch = checked
    train.main(sys.argv[2:])
    print("no host sync inside train_one_epoch")


if __name__ == "__main__":
    main()
