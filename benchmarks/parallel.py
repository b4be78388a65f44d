"""Step time and memory per rank of each parallel layout, with a 1-process baseline in the same run.

    python benchmarks/parallel.py                      # 1, 2 and 4 processes on this machine
    python benchmarks/parallel.py --depth 12 --hidden 384 --heads 6 --input 32 --batch 32

Each launch runs several layouts in turn (process-group start-up is the slow part). "state" is
what a rank holds of parameters, gradients, AdamW moments and EMA (what sharding divides);
"peak" is the rank's peak resident memory on CPU (VmHWM, reset per layout) or the peak CUDA
allocation on GPU.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time

LAYOUTS = {
    1: {"single": {}},
    2: {
        "ddp": {"dp_replicate": 2, "dp_shard": 1},
        "fsdp": {"dp_shard": 2},
        "tp": {"tp": 2, "dp_shard": 1},
        "pp_gpipe": {"pp": 2, "dp_shard": 1, "pp_schedule": "gpipe"},
        "pp_1f1b": {"pp": 2, "dp_shard": 1, "pp_schedule": "1f1b"},
    },
    4: {
        "fsdp": {"dp_shard": 4},
        "hsdp": {"dp_replicate": 2, "dp_shard": 2},
        "fsdp_tp": {"dp_shard": 2, "tp": 2},
        "pp_fsdp": {"pp": 2, "dp_shard": 2, "pp_microbatches": 2},
    },
}


def _config(args, parallel):
    from dit_trainer.config import build_config

    return build_config({
        "output_dir": "/tmp/dit-bench",
        "model": {"name": "DiT-S/2", "input_size": args.input, "in_channels": 4, "num_classes": 1000,
                  "depth": args.depth, "hidden_size": args.hidden, "num_heads": args.heads},
        "data": {"num_workers": 0},
        "train": {"global_batch_size": args.batch, "mixed_precision": args.precision, "device": args.device,
                  "activation_checkpointing": args.ac, "compile": args.compile},
        "logging": {"tensorboard": False, "progress": False},
        "parallel": {"pp_microbatches": 4, **parallel},
    })


class _Latents:
    def __init__(self, n, c, s):
        import torch

        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, c, s, s, generator=g), torch.randint(0, 1000, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _reset_peak(device):
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:  # "5" resets VmHWM (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def _state_mib(trainer) -> float:
    from dit_trainer.parallel.utils import local

    n = 0
    for p in trainer.model.parameters():
        n += local(p).nbytes + (local(p.grad).nbytes if p.grad is not None else 0)
    for st in trainer.optimizer.state.values():
        n += sum(local(v).nbytes for v in st.values() if hasattr(v, "nbytes") and v.dim() > 0)
    ema = trainer.ema.state_dict() if hasattr(trainer.ema, "shadow") else dict(trainer.ema.named_parameters())
    n += sum(local(v).nbytes for v in ema.values())
    return n / 2**20


def worker(args):
    import torch
    import torch.distributed as dist
    from _common import peak_mib

    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.train import DiTTrainer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rows = []
    # World sizes without a list of layouts (8 GPUs, say) run plain FSDP over all ranks.
    for name, parallel in LAYOUTS.get(world, {"fsdp": {"dp_shard": world}}).items():
        if args.layouts and name not in args.layouts.split(","):
            continue
        keep_freed_memory_on(args.device)  # as `dit train` (the trainer leaves it to its caller)
        trainer = DiTTrainer(_config(args, parallel), dataset=_Latents(args.batch * 4, 4, args.input))
        loader = trainer.build_loader()
        for _ in range(args.warmup):
            trainer.train_step(next(loader))
        _reset_peak(trainer.device)
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            trainer.train_step(next(loader))
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        step_s = (time.perf_counter() - t0) / args.steps
        mine = {"state": _state_mib(trainer), "peak": peak_mib(trainer.device)}
        every = [None] * world
        if world > 1:
            dist.all_gather_object(every, mine)
        else:
            every = [mine]
        rows.append({"layout": name, "ranks": world, "s_per_step": step_s,
                     "img_per_s": args.batch / step_s,
                     "state_mib": [r["state"] for r in every], "peak_mib": [r["peak"] for r in every]})
        del trainer, loader
        gc.collect()  # its reference cycles hold sub-groups: freed before the next case and the group's end
    if world == 1 or dist.get_rank() == 0:
        for row in rows:
            print("ROW " + json.dumps(row), flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--input", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--ac", default="none")
    ap.add_argument("--compile", action="store_true", help="per-block torch.compile (train.compile)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--world-sizes", default="1,2,4")
    ap.add_argument("--layouts", default="", help="comma-separated layout names (default: all)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    # Every flag but --world-sizes goes to the workers (its value too when given as a separate word).
    argv, passthrough = sys.argv[1:], []
    skip = False
    for a in argv:
        if skip or a.startswith("--world-sizes"):
            skip = a == "--world-sizes"
            continue
        passthrough.append(a)
    rows = []
    for n in map(int, args.world_sizes.split(",")):
        launcher = [sys.executable] if n == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run([*launcher, __file__, "--worker", *passthrough], capture_output=True, text=True, env=env)
        if proc.returncode:
            sys.exit(f"{n}-process launch failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
        rows += [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]

    import torch

    gpu = f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") and torch.cuda.is_available() else ""
    print(f"# {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {args.device}{gpu}, DiT depth {args.depth} "
          f"hidden {args.hidden} heads {args.heads}, {args.input}x{args.input}x4 latents, global batch {args.batch}, "
          f"{args.precision}{', compile' if args.compile else ''}, {os.cpu_count()} CPU cores")
    print("| layout | ranks | s/step | img/s | state MiB/rank (max) | peak MiB/rank (max) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['ranks']} | {r['s_per_step']:.3f} | {r['img_per_s']:.1f} | "
              f"{max(r['state_mib']):.1f} | {max(r['peak_mib']):.0f} |")


if __name__ == "__main__":
    main()
