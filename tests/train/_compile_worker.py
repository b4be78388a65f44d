"""One tiny compiled training run in a fresh process, for the compile-cache test: prints one JSON line
with torch's compile-cache counters and the folder the trainer chose. `--then-hidden-size N` then
builds a trainer of another width in the same process and compiles its blocks' forward (no grad:
half the compile of a step), counted apart as "changed"."""

import argparse
import json
from pathlib import Path

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
    p.add_argument("--then-hidden-size", type=int, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    trainer = DiTTrainer(config(args.out, args.hidden_size, args.steps, args.compile_cache), dataset=Latents())
    trainer.train()
    report = {"folder": str(trainer.compile_cache), "inductor": dict(counters["inductor"]),
              "aot_autograd": dict(counters["aot_autograd"])}
    if args.then_hidden_size:
        counters.clear()
        # The same cache root as the first run's: only the model differs.
        root = str(Path(trainer.compile_cache).parent)
        other = DiTTrainer(config(args.out + "-changed", args.then_hidden_size, 1, root), dataset=Latents())
        model = other.model.eval()
        with torch.no_grad():
            model(torch.randn(2, 4, 8, 8), torch.tensor([1, 500]), torch.tensor([3, 4]))
        report["changed"] = {"folder": str(other.compile_cache), "inductor": dict(counters["inductor"])}
    print(json.dumps(report))


def config(out, hidden_size, steps, compile_cache):
    return tiny_config(out, model={"depth": 1, "hidden_size": hidden_size, "num_heads": 2},
                       train={"max_steps": steps, "compile": "true", "compile_cache": compile_cache},
                       logging={"log_steps": 1000, "progress": False, "tensorboard": False})


if __name__ == "__main__":
    main()
