"""The planner's prediction for one GPU against DiT-XL/2 training measured on it: peak memory and img/s.

    python benchmarks/plan_gpu.py --logs LOG_DIR        # gpu_check.sh's train_b32 / train_b128 logs
    python benchmarks/plan_gpu.py --measure             # or run the steps here (eager, and with full AC)

`--logs` reads the tables train_step.py printed inside gpu_check.sh (variants bf16+compile and
bf16+compile+ac: peak `torch.cuda.max_memory_allocated`, img/s) and prices the same runs with
`dit_trainer.plan` on the profile of the GPU it finds (h200, h100, a100; else h100), or on
`--hardware` where the logs are read without a GPU. `--measure`
trains them itself (`DiTTrainer.train_step`, bf16 autocast, `--variants`), reading the allocator's
peak over one step (step_memory.py) and the median of `--steps` timed steps. Either way it also
prints `dit plan`'s ranking for the GPU at batch 256.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

MODEL = "DiT-XL/2"


def layout_of(variant: str, budget: float = 0.8):
    """The planner's Layout of one process for a train_step.py variant name (bf16+compile+ac, ...)."""
    from dit_trainer.plan.layouts import Layout

    mods = variant.split("+")[1:]
    ac = "full" if "ac" in mods else "selective" if "sac" in mods else "none"
    budgets = [float(m[6:]) for m in mods if m.startswith("budget")]
    return Layout(ac=ac, compile="compile" in mods, budget=budgets[0] if budgets else budget)


def predict(hardware, batch: int, variant: str):
    """(predicted peak MiB, predicted img/s) of DiT-XL/2 at `batch` on one GPU."""
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec
    from dit_trainer.plan.memory import Numerics, rank_memory
    from dit_trainer.plan.timing import Machine, step_time

    cfg = build_config(None, ["--model.name", MODEL, "--train.global_batch_size", str(batch)])
    costs = get_spec(MODEL).costs_fn(cfg)
    layout = layout_of(variant, cfg.train.activation_memory_budget)
    numerics = Numerics.of("bf16", "cuda")
    memory = rank_memory(costs, layout, batch, numerics)[0].total / 2**20
    seconds = step_time(costs, layout, Machine(1, 1, hardware), numerics, batch).total
    return memory, batch / seconds


def from_logs(logs: Path) -> list:
    """(batch, variant, measured MiB, measured img/s) from gpu_check.sh's train_step.py logs."""
    import re

    from gpu_check import table_rows

    rows = []
    for name in ("train_b32", "train_b128"):
        path = logs / f"{name}.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        batch = re.search(r"batch (\d+)", text)
        for r in table_rows(text, "variant"):
            rows.append((int(batch.group(1)) if batch else int(name[7:]), r["variant"], float(r["peak mem MiB"]),
                         float(r["img/s"])))
    return rows


def measure(batches, variants, steps: int) -> list:
    """(batch, variant, peak MiB, img/s) of DiTTrainer steps on this GPU."""
    import torch
    from step_memory import step_peak

    from dit_trainer.config import build_config
    from dit_trainer.train import DiTTrainer

    rows = []
    for batch in batches:
        for variant in variants:
            layout = layout_of(variant)
            cfg = build_config({"output_dir": tempfile.mkdtemp(), "model": {"name": MODEL, "input_size": 32},
                                    "train": {"global_batch_size": batch, "device": "cuda", "max_steps": 10,
                                              "compile": "true" if layout.compile else "false",
                                              "activation_checkpointing": layout.ac},
                                    "logging": {"tensorboard": False, "progress": False}})
            trainer = DiTTrainer(cfg, dataset=[])
            x = torch.randn(batch, 4, 32, 32, device="cuda")
            y = torch.randint(0, 1000, (batch,), device="cuda")
            for _ in range(2):
                trainer.train_step((x, y))
            peak = step_peak(trainer, (x, y))["peak"] / 2**20
            times = []
            for _ in range(steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                trainer.train_step((x, y))
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            rows.append((batch, variant, peak, batch / statistics.median(times)))
            del trainer
            torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", type=Path, default=None, help="gpu_check.sh's LOG_DIR")
    ap.add_argument("--measure", action="store_true", help="train the variants here instead")
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--variants", default="bf16,bf16+ac")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--hardware", default=None, help="profile (default: the GPU's by name)")
    args = ap.parse_args()
    import torch

    from dit_trainer.plan.hardware import detect_hardware, load_hardware

    here = args.measure or args.logs is None
    if (here or not args.hardware) and not torch.cuda.is_available():
        print("plan_gpu: no CUDA GPU; run it on a GPU machine (or read --logs with --hardware)", file=sys.stderr)
        return 2
    hardware = load_hardware(args.hardware) if args.hardware else detect_hardware("cuda")
    rows = (measure([int(b) for b in args.batches.split(",")], args.variants.split(","), args.steps)
            if here else from_logs(args.logs))
    if torch.cuda.is_available():
        gpu, memory = torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory / 2**30
    else:  # logs read elsewhere: gpu_check.sh recorded the GPU
        gpu_file = args.logs / "gpu"
        gpu = gpu_file.read_text().strip() if gpu_file.is_file() else hardware.name
        memory = hardware.memory_gib
    print(f"# benchmarks/plan_gpu.py  {time.strftime('%Y-%m-%d %H:%M')}  {gpu}; planned with torch {torch.__version__}; "
          f"{MODEL} 256 px, one GPU, profile {hardware.name}; "
          f"{'measured here' if args.measure or args.logs is None else f'measured by gpu_check.sh in {args.logs}'}")
    print("| batch | variant | pred peak MiB | meas peak MiB | mem err | pred img/s | meas img/s | speed err |")
    print("|--:|---|--:|--:|--:|--:|--:|--:|")
    for batch, variant, mib, img_s in rows:
        p_mib, p_img = predict(hardware, batch, variant)
        print(f"| {batch} | {variant} | {p_mib:.0f} | {mib:.0f} | {100 * (mib / p_mib - 1):+.1f}% | {p_img:.1f} | "
              f"{img_s:.1f} | {100 * (img_s / p_img - 1):+.1f}% |")
    memory = f"{memory:.0f}GiB"
    print(f"\n## dit plan --model {MODEL} --gpus 1 --gpu-memory {memory} --hardware {hardware.name}", flush=True)
    subprocess.run([sys.executable, "-m", "dit_trainer", "plan", "--model", MODEL, "--gpus", "1", "--gpu-memory",
                    memory, "--hardware", hardware.source if os.path.isfile(hardware.source) else hardware.name,
                    "--top", "5", "--unfit", "3"], env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
