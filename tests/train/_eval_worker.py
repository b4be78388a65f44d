"""torchrun worker: the digits run of test_eval_during_training under each layout named, FID every 2 steps."""

import sys
from pathlib import Path

import torch.distributed as dist

from dit_trainer.config import build_config
from dit_trainer.cli import leave_process_group
from dit_trainer.train import DiTTrainer
# The repository root is on PYTHONPATH: tests/parallel/_common.launch passes it (tests/subprocess_env.py).
from tests.train.test_eval_during_training import _digits_config


def main():
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")  # once: starting the process group is the slow part
    for layout in sys.argv[2:]:
        cfg = _digits_config(out / layout, 2)
        cfg["parallel"] = {"fsdp": {"dp_shard": 2}, "pp": {"pp": 2, "dp_shard": 1, "pp_microbatches": 2}}[layout]
        cfg["train"]["device"] = "cpu"
        DiTTrainer(build_config(cfg)).train()
    leave_process_group()  # frees the finished trainers before the group goes, as `dit` does


if __name__ == "__main__":
    main()
