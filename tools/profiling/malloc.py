"""CPU inference with glibc's malloc as it comes vs `host_memory.keep_freed_memory` (what `dit sample`,
`sample-ddp`, `eval` and `extract` apply on CPU unless `--keep-freed-memory false`): images/s,
kernel CPU seconds, minor page faults and peak RSS.

    python tools/profiling/malloc.py                          # every workload, 2 rounds
    python tools/profiling/malloc.py --workloads features --rounds 3

Workloads, random weights at the real sizes (no download):
  sample    `dit sample`'s `sample_latents`: DiT-S/2, 32x32x4 latents, batch 32 with guidance 4.0
            (64 rows through the model), DDIM with 3 steps per timed batch;
  features  `dit eval`'s FID Inception-v3 (`evaluate/inception.py`) on 256 px uint8 images,
            batch 64 (the command's default), through `iter_features`;
  encode    `dit extract`'s VAE encode: a diffusers AutoencoderKL with sd-vae-ft-mse's encoder
            sizes (channels 128/256/512/512, 2 layers per block) on 256 px images, batch 8.

The setting is process-wide and cannot be undone, so every measurement is a fresh process. Each
round runs both modes, the order swapped every round, and the speed ratio is the median over rounds
of kept / default within a round (a shared VM's speed drifts by +-20% within minutes).
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

WORKLOADS = ("sample", "features", "encode")


def child(workload: str, mode: str, batches: int) -> dict:
    """Build the workload's network, warm up one batch, time `batches` more; return the numbers."""
    import numpy as np
    import torch

    from dit_trainer.host_memory import keep_freed_memory

    if mode == "keep" and not keep_freed_memory():
        raise SystemExit("keep_freed_memory had no effect here (not glibc's malloc?)")
    torch.manual_seed(0)
    if workload == "sample":
        from dit_trainer.config import build_config
        from dit_trainer.models import get_spec
        from dit_trainer.sample import sample_latents

        cfg = {"model": {"name": "DiT-S/2", "input_size": 32, "in_channels": 4, "num_classes": 1000}}
        model, batch = get_spec("DiT-S/2").build_model_fn(build_config(cfg)).eval(), 32
        labels = [(207 + 13 * i) % 1000 for i in range(batch)]

        def step():
            sample_latents(model, None, labels, cfg_scale=4.0, sampler="ddim", steps=3, seed=0,
                           device=torch.device("cpu"))
    elif workload == "features":
        from dit_trainer.evaluate.features import iter_features
        from dit_trainer.evaluate.inception import FIDInceptionV3

        net, batch = FIDInceptionV3(), 64
        images = np.random.default_rng(0).integers(0, 256, (batch, 256, 256, 3), dtype=np.uint8)

        def step():
            for _ in iter_features(net, images, batch_size=batch, progress=False):
                pass
    else:
        from diffusers import AutoencoderKL

        vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
                            up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4,
                            sample_size=256).eval()
        batch = 8
        x = torch.randn(batch, 3, 256, 256)

        def step():
            with torch.no_grad():
                vae.encode(x).latent_dist.mean.sum().item()

    step()  # warm-up: kernels, lazy init, the heap's first growth
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(batches):
        step()
    seconds, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    return {"img_s": batch * batches / seconds, "sys_s": (after.ru_stime - before.ru_stime) / batches,
            "faults": (after.ru_minflt - before.ru_minflt) / batches, "peak_mib": hwm, "batch": batch}


def run_child(args, workload: str, mode: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, mode, "--batches", str(args.batches)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"{workload} ({mode}) failed in its fresh process:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    p.add_argument("--rounds", type=int, default=2, help="rounds of both modes, order swapped each round")
    p.add_argument("--batches", type=int, default=2, help="timed batches per process after one warm-up batch")
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args.batches)), flush=True)
        return 0
    workloads = args.workloads.split(",")
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        p.error(f"unknown workload {bad[0]!r}; choose from {', '.join(WORKLOADS)}")
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# tools/profiling/malloc.py {time.strftime('%Y-%m-%d %H:%M')} torch {torch.__version__} "
          f"{platform.processor() or platform.machine()} {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
          f"load {load:.1f}; {args.rounds} rounds, {args.batches} timed batches per fresh process, fp32")
    print("| workload | batch | malloc | img/s (median) | kernel CPU s/batch | minor faults/batch | peak RSS MiB "
          "| speed vs default (per-round median, min-max) |")
    print("|---|--:|---|--:|--:|--:|--:|--:|")
    for workload in workloads:
        runs = {"default": [], "keep": []}
        for r in range(args.rounds):
            for mode in (("default", "keep") if r % 2 == 0 else ("keep", "default")):
                runs[mode].append(run_child(args, workload, mode))
        ratios = [k["img_s"] / d["img_s"] for d, k in zip(runs["default"], runs["keep"])]
        for mode, label in (("default", "glibc default"), ("keep", "keep_freed_memory")):
            rs = runs[mode]
            ratio = (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if mode == "keep"
                     else "1.00x")
            print(f"| {workload} | {rs[0]['batch']} | {label} | {statistics.median(r['img_s'] for r in rs):.3g} | "
                  f"{statistics.median(r['sys_s'] for r in rs):.2f} | {statistics.median(r['faults'] for r in rs):,.0f} | "
                  f"{max(r['peak_mib'] for r in rs):.0f} | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
