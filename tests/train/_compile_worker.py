"""Compiled runs in a fresh process for the compile-cache tests; each prints one JSON line with torch's
compile-cache counters and the folder the trainer chose.

    python -m tests.train._compile_worker OUT [--steps N]   # a tiny compiled training run
    python -m tests.train._compile_worker OUT --steps 2 --then-wider  # then a wider model's step forced into OUT's folder
"""

import argparse
import json

import torch
from torch._dynamo.utils import counters

from dit_trainer.train import DiTTrainer
# The repository root is on PYTHONPATH: the test passes it (tests/subprocess_env.py).
from tests.train.trainer_helpers import tiny_config


class Latents(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(8, 4, 8, 8, generator=g)
        self.y = torch.randint(0, 10, (8,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--hidden-size", type=int, default=32)
    p.add_argument("--compile-cache", default="auto")
    p.add_argument("--then-wider", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    trainer = DiTTrainer(config(args.out, args.hidden_size, args.steps, args.compile_cache), dataset=Latents())
    trainer.train()
    got = {"folder": str(trainer.compile_cache), "inductor": dict(counters["inductor"]),
           "aot_autograd": dict(counters["aot_autograd"])}
    if args.then_wider:
        got["other"] = wider(args, trainer.compile_cache)
    print(json.dumps(got))


def wider(args, folder):
    """A wider model's training step compiled into `folder` (the first model's): inductor's own keys keep it
    from the first model's entries, whatever folder it is pointed at."""
    from dit_trainer.train.compile_cache import HEADER_FOLDER_NAME, point_torch_at

    counters.clear()
    other = DiTTrainer(config(args.out + "-wider", args.hidden_size + 16, 1, args.compile_cache), dataset=Latents())
    point_torch_at(folder, folder.parent / HEADER_FOLDER_NAME)
    other.train()
    return {"folder": str(other.compile_cache), "inductor": dict(counters["inductor"])}


def config(out, hidden_size, steps, compile_cache):
    return tiny_config(out, model={"depth": 1, "hidden_size": hidden_size, "num_heads": 2},
                       train={"max_steps": steps, "compile": "true", "compile_cache": compile_cache},
                       logging={"log_steps": 1000, "progress": False, "tensorboard": False})


if __name__ == "__main__":
    main()
