"""torchrun worker: train the tiny DiT under several layouts in one launch (process-group start-up
is the slow part), and resume 2-rank checkpoints under this launch's layouts."""

import argparse
import faulthandler
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from dit_trainer.cli import leave_process_group
from dit_trainer.train import DiTTrainer
# The repository root is on PYTHONPATH: _common.launch passes it (tests/subprocess_env.py).
from tests.parallel._common import (BLOCK_OPTION_LAYOUTS, LAYOUT_TRAIN, LAYOUTS_2, LAYOUTS_4, LAYOUTS_OPTIONS,
                                    dataset_for, kind_of, option_sections, tiny_config, train_run)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="")
    ap.add_argument("--resume", default="", help="layout=checkpoint_dir,... : continue those checkpoints under layout")
    ap.add_argument("--text-check", default="", help="assets folder of tests/text_encoders/_shard_check.py to run first")
    args = ap.parse_args()
    faulthandler.enable()  # a rank that crashes in native code says where, in the launch's output
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    layouts = {**LAYOUTS_2, **LAYOUTS_4, **BLOCK_OPTION_LAYOUTS, **LAYOUTS_OPTIONS}
    out = Path(args.out)
    if args.text_check:  # a sharded text encoder, in this launch rather than a process group of its own
        from tests.text_encoders._shard_check import run

        run(args.text_check, out)
    for name in filter(None, args.layouts.split(",")):
        cfg = tiny_config(out / name, layouts[name], kind=kind_of(name), train=LAYOUT_TRAIN.get(name, {}),
                          **option_sections(name))
        train_run(cfg, kind_of(name), dist.get_rank())
    for item in filter(None, args.resume.split(",")):
        name, src = item.split("=")
        run = out / f"resume_{name}_{Path(src).parent.parent.name}"
        if dist.get_rank() == 0:
            shutil.rmtree(run, ignore_errors=True)
            (run / "checkpoints").mkdir(parents=True)
            shutil.copytree(src, run / "checkpoints" / Path(src).name)
        dist.barrier()
        DiTTrainer(tiny_config(run, layouts[name], kind=kind_of(name)), dataset=dataset_for(kind_of(name))).train()
    leave_process_group()  # frees the finished trainers before the group goes, as `dit` does


if __name__ == "__main__":
    main()
