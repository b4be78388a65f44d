"""torchrun worker: REPA on the digits under the layouts named on the command line (one launch)."""

import argparse
from pathlib import Path

import torch
import torch.distributed as dist

from dit_trainer.cli import leave_process_group
from dit_trainer.train import DiTTrainer
# The repository root is on PYTHONPATH: tests/parallel/_common.launch passes it.
from tests.repa.test_layouts import LAYOUTS, layout_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    for name in filter(None, args.layouts.split(",")):
        DiTTrainer(layout_config(Path(args.out) / name, LAYOUTS[name])).train()
    leave_process_group()


if __name__ == "__main__":
    main()
