"""torchrun worker: the tiny DiT with post-hoc EMA under the 2-rank layouts named by --layouts."""

import argparse
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from dit_trainer.cli import leave_process_group
from dit_trainer.train import DiTTrainer
# The repository root is on PYTHONPATH: tests.parallel._common.launch passes it.
from tests.parallel._common import LAYOUTS_2, TinyLatents, tiny_config
from tests.phema.test_distributed import PHEMA


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", required=True)
    ap.add_argument("--resume", default="", help="layout=checkpoint_dir: continue that checkpoint under layout")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    for name in args.layouts.split(","):
        DiTTrainer(tiny_config(Path(args.out) / name, LAYOUTS_2[name], train=PHEMA), dataset=TinyLatents()).train()
    for item in filter(None, args.resume.split(",")):
        name, src = item.split("=")
        run = Path(args.out) / f"resumed_{name}"
        if dist.get_rank() == 0:
            shutil.copytree(src, run / "checkpoints" / Path(src).name)
        dist.barrier()
        DiTTrainer(tiny_config(run, LAYOUTS_2[name], train=PHEMA), dataset=TinyLatents()).train()
    leave_process_group()


if __name__ == "__main__":
    main()
