"""Compiled runs in a fresh process for the compile-cache tests; each prints one JSON line with torch's
compile-cache counters and the folder the trainer chose.

    python -m tests.train._compile_worker OUT [--steps N]   # a tiny compiled training run
    python -m tests.train._compile_worker OUT --same-folder  # two widths' forwards forced into one folder
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
    p.add_argument("--same-folder", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.same_folder:
        return same_folder(args)
    trainer = DiTTrainer(config(args.out, args.hidden_size, args.steps, args.compile_cache), dataset=Latents())
    trainer.train()
    print(json.dumps({"folder": str(trainer.compile_cache), "inductor": dict(counters["inductor"]),
                      "aot_autograd": dict(counters["aot_autograd"])}))


def forward(trainer):
    """The trainer's compiled blocks' forward, without grad (half the compile of a training step)."""
    with torch.no_grad():
        trainer.model.eval()(torch.randn(2, 4, 8, 8), torch.tensor([1, 500]), torch.tensor([3, 4]))


def same_folder(args):
    """Two widths compiled into one folder (the first's): inductor's own keys keep the second from the first's
    entries, whatever folder it is pointed at."""
    from dit_trainer.train.compile_cache import HEADER_FOLDER_NAME, point_torch_at

    first = DiTTrainer(config(args.out, args.hidden_size, 1, args.compile_cache), dataset=Latents())
    forward(first)
    before = dict(counters["inductor"])
    counters.clear()
    other = DiTTrainer(config(args.out + "-wider", args.hidden_size + 16, 1, args.compile_cache), dataset=Latents())
    point_torch_at(first.compile_cache, first.compile_cache.parent / HEADER_FOLDER_NAME)
    forward(other)
    print(json.dumps({"folder": str(first.compile_cache), "inductor": before,
                      "other": {"folder": str(other.compile_cache), "inductor": dict(counters["inductor"])}}))


def config(out, hidden_size, steps, compile_cache):
    return tiny_config(out, model={"depth": 1, "hidden_size": hidden_size, "num_heads": 2},
                       train={"max_steps": steps, "compile": "true", "compile_cache": compile_cache},
                       logging={"log_steps": 1000, "progress": False, "tensorboard": False})


if __name__ == "__main__":
    main()
