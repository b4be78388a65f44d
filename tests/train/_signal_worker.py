"""A tiny training run for the signal tests, on one process or under torchrun.

`--slow` makes every sample take a moment to load, so the test can signal the run mid-way;
`--reference DIR` first trains an uninterrupted copy of the same run into DIR.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dit_trainer.train import DiTTrainer
# The repository root is on PYTHONPATH: test_signals.py passes it (tests/subprocess_env.py).
from tests.train.trainer_helpers import tiny_config

STEPS = 8


class Latents(torch.utils.data.Dataset):
    def __init__(self, delay=0.0):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(16, 4, 8, 8, generator=g)
        self.y = torch.randint(0, 10, (16,), generator=g)
        self.delay = delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def config(out, parallel):
    return tiny_config(out, train={"max_steps": STEPS, "global_batch_size": 4, "seed": 3},
                       optim={"lr": 1e-3}, checkpoint={"save_steps": 4, "save_total_limit": 0},
                       parallel=parallel)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--slow", action="store_true")
    ap.add_argument("--reference", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    parallel = {}
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        parallel = {"dp_shard": dist.get_world_size()}
    rank = dist.get_rank() if dist.is_initialized() else 0
    if args.reference:
        DiTTrainer(config(args.reference, parallel), dataset=Latents()).train()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"pid-rank{rank}").write_text(str(os.getpid()))
    try:
        trainer = DiTTrainer(config(args.out, parallel), dataset=Latents(0.15 if args.slow else 0.0))
        trainer.train()
    except KeyboardInterrupt:
        sys.exit(130)
    (Path(args.out) / f"done-rank{rank}").write_text(str(trainer.step))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
