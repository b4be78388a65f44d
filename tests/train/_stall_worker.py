"""torchrun worker for the stalled-rank test: a tiny FSDP run, slow enough to be stopped mid-way.

Each rank writes its pid (`pid-rankN`) and its process group's timeout in seconds (`timeout-rankN`)
into the run folder; the run itself is `dit train`'s trainer with `parallel.timeout` from the
command line, so the trainer creates the process group.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dit_trainer.train import DiTTrainer
# The repository root is on PYTHONPATH: the test passes it (tests/subprocess_env.py).
from tests.train.trainer_helpers import tiny_config


class Latents(torch.utils.data.Dataset):
    """16 random latents; each takes `delay` seconds to load, so a step lasts long enough to be seen."""

    def __init__(self, delay):
        g = torch.Generator().manual_seed(5)
        self.x, self.y, self.delay = torch.randn(16, 4, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g), delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out, rank = Path(args.out), int(os.environ["RANK"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pid-rank{rank}").write_text(str(os.getpid()))
    cfg = tiny_config(out, parallel={"dp_shard": 2, "timeout": args.timeout},
                      train={"max_steps": args.steps, "global_batch_size": 4, "seed": 1},
                      checkpoint={"save_steps": 3, "save_total_limit": 2})
    trainer = DiTTrainer(cfg, dataset=Latents(0.02))
    group = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    (out / f"timeout-rank{rank}").write_text(str(group.options._timeout.total_seconds()))
    trainer.train()


if __name__ == "__main__":
    main()
