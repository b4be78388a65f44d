"""Worker of the torchrun-agent tests: trains the tiny DiT of tests/parallel/_common under the layouts named
(the trainer joins the process group itself, as `dit train` does) and writes where each rank ran."""

import argparse
import json
import os
from pathlib import Path

import torch

from dit_trainer.cli import leave_process_group
from dit_trainer.train import DiTTrainer
# The repository root is on PYTHONPATH: tests/subprocess_env.py passes it.
from tests.parallel._common import LAYOUT_TRAIN, TinyLatents, tiny_config

# Across two agents: DDP and FSDP over every rank, HSDP replicating across the agents, sharding within each.
LAYOUTS = {"ddp": {"dp_replicate": -1, "dp_shard": 1}, "fsdp": {"dp_shard": -1},
           "hsdp": {"dp_replicate": 2, "dp_shard": -1}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", required=True)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    out = Path(args.out)
    for name in args.layouts.split(","):
        cfg = tiny_config(out / name, LAYOUTS[name], train=LAYOUT_TRAIN.get(name, {}))
        DiTTrainer(cfg, dataset=TinyLatents()).train()
    where = {k: int(os.environ[k]) for k in ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE")}
    (out / f"rank{where['RANK']}.json").write_text(json.dumps(where))
    leave_process_group()


if __name__ == "__main__":
    main()
