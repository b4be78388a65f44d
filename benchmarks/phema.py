"""What post-hoc EMA (`train.phema_stds`) costs: per-step update time, snapshot size and write time,
and `dit ema`'s reconstruction time, measured on the demo's model; the same for DiT-XL/2 (675M
parameters) as arithmetic on its parameter count.

    python benchmarks/phema.py [--stds 0.05 0.10] [--steps 30] [--reps 200] [--snapshots 8] [--json PATH]

The update is timed alone (PowerEMA.update, median of --reps) beside the EMA's (ShardedEMA.update),
and inside whole `train_step`s of the demo's config with the option off and on, alternating, so a
busy neighbour slows both alike. Writes its runs to a temporary folder and deletes it.
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import tempfile
import time

import torch
from _common import machine, table

from dit_trainer.config import build_config, config_yaml
from dit_trainer.demo import demo_config
from dit_trainer.models import get_spec
from dit_trainer.parallel.ema import ShardedEMA
from dit_trainer.phema import PowerEMA, reconstruct
from dit_trainer.train import DiTTrainer


def median_s(fn, reps: int) -> float:
    """The median wall time of `fn()` over `reps` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def counts(model) -> tuple:
    """(trained, frozen) parameter counts and the frozen ones' bytes."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    return trained, sum(p.numel() for p in frozen), sum(p.numel() * p.element_size() for p in frozen)


def snapshot_bytes(trained: int, frozen_bytes: int, n_stds: int, dtype: str) -> int:
    """Tensor bytes of one snapshot (the safetensors header adds a few kB)."""
    return trained * n_stds * (2 if dtype == "fp16" else 4) + frozen_bytes


def step_times(cfg_dict, stds, steps: int) -> tuple:
    """Median train_step seconds of the demo config with post-hoc EMA off and on (alternating steps)."""
    trainers = {}
    for name, value in (("off", []), ("on", list(stds))):
        cfg = build_config({**cfg_dict, "output_dir": os.path.join(cfg_dict["output_dir"], name),
                            "train": {**cfg_dict["train"], "phema_stds": value}})
        trainer = DiTTrainer(cfg)
        trainer.loader = trainer.build_loader()
        trainers[name] = trainer
    times = {"off": [], "on": []}
    for i in range(steps + 2):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            trainer.train_step(next(trainer.loader))
            if i >= 2:  # the first steps allocate
                times[name].append(time.perf_counter() - t0)
    return statistics.median(times["off"]), statistics.median(times["on"]), trainers["on"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stds", type=float, nargs="+", default=[0.05, 0.10])
    ap.add_argument("--steps", type=int, default=30, help="train steps timed per variant")
    ap.add_argument("--reps", type=int, default=200, help="timed calls of each update")
    ap.add_argument("--snapshots", type=int, default=8, help="snapshots written and reconstructed from")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    print(f"# post-hoc EMA cost  {datetime.datetime.now():%Y-%m-%d %H:%M}  torch {torch.__version__}")
    print(f"# {machine(device)}")
    tmp = tempfile.mkdtemp(prefix="phema-bench-")
    try:
        cfg = demo_config(os.path.join(tmp, "demo"))
        # The demo's own run, no compile (`auto` would compile for a longer max_steps).
        cfg["train"]["compile"] = "false"
        off_s, on_s, trainer = step_times(cfg, args.stds, args.steps)
        model = trainer.model
        trained, frozen, frozen_bytes = counts(model)
        ema = ShardedEMA(model)
        tracker = PowerEMA(model, args.stds)
        ema_s = median_s(lambda: ema.update(0.9999), args.reps)
        step = iter(range(2, 10**9))
        phema_s = median_s(lambda: tracker.update(next(step)), args.reps)
        snaps = {}
        for dtype in ("fp16", "fp32"):
            run = os.path.join(tmp, f"snap-{dtype}")
            os.makedirs(run)
            with open(os.path.join(run, "config.yaml"), "w") as f:
                f.write(config_yaml(trainer.cfg))  # what `dit ema` copies into its folders
            writer = PowerEMA(model, args.stds, output_dir=run, every=1, dtype=dtype)
            times = []
            for i in range(1, args.snapshots + 1):
                writer.update(i)
                t0 = time.perf_counter()
                path = writer.write_snapshot(i * 100)
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            reconstruct(run, [0.07])
            snaps[dtype] = {"bytes": os.path.getsize(path), "write_s": statistics.median(times),
                            "reconstruct_s": time.perf_counter() - t0}
        with torch.device("meta"):
            xl = get_spec("DiT-XL/2").build_model_fn({"model": {"name": "DiT-XL/2", "input_size": 32}})
        xl_trained, xl_frozen, xl_frozen_bytes = counts(xl)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    n = len(args.stds)
    stds = ", ".join(map(str, args.stds))
    print(f"\ndemo model (DiT-S/4, depth 4, width 192): {trained:,} trained + {frozen:,} frozen parameters; "
          f"{n} profiles ({stds})\n")
    # Each profile's update reads its shadow and the weights and writes the shadow: 3 fp32 passes.
    traffic = 3 * 4 * trained * n
    rows = [["EMA update (ShardedEMA, baseline)", f"{ema_s * 1e3:.3f} ms", ""],
            [f"post-hoc EMA update ({n} profiles)", f"{phema_s * 1e3:.3f} ms",
             f"{traffic / phema_s / 1e9:.1f} GB/s moved"],
            ["train_step, post-hoc EMA off", f"{off_s * 1e3:.1f} ms", f"batch {cfg['train']['global_batch_size']}"],
            ["train_step, post-hoc EMA on", f"{on_s * 1e3:.1f} ms", f"{(on_s - off_s) / off_s:+.1%} (median of {args.steps})"]]
    for dtype, s in snaps.items():
        rows.append([f"snapshot ({dtype})", f"{s['write_s'] * 1e3:.1f} ms", f"{s['bytes'] / 2**20:.2f} MiB on disk"])
        rows.append([f"dit ema, 1 width from {args.snapshots} {dtype} snapshots", f"{s['reconstruct_s']:.2f} s", ""])
    print(table(["demo model", "time", "note"], rows))

    xl_traffic = 3 * 4 * xl_trained * n
    write_rate = snaps["fp16"]["bytes"] / snaps["fp16"]["write_s"]
    cpu_xl_s = xl_traffic / (traffic / phema_s)
    print(f"\nDiT-XL/2 (arithmetic): {xl_trained:,} trained + {xl_frozen:,} frozen parameters, {n} profiles\n")
    rows = [["memory per copy of the weights (fp32; 1/N per rank under FSDP)", f"{xl_trained * 4 / 2**30:.2f} GiB",
             f"x{n} profiles: {n * xl_trained * 4 / 2**30:.2f} GiB"],
            ["snapshot on disk (fp16)", f"{snapshot_bytes(xl_trained, xl_frozen_bytes, n, 'fp16') / 2**30:.2f} GiB", ""],
            ["snapshot on disk (fp32)", f"{snapshot_bytes(xl_trained, xl_frozen_bytes, n, 'fp32') / 2**30:.2f} GiB", ""],
            ["snapshot write (fp16), at the demo's measured write rate",
             f"{snapshot_bytes(xl_trained, xl_frozen_bytes, n, 'fp16') / write_rate:.1f} s",
             f"{write_rate / 2**20:.0f} MiB/s; training waits for it every train.phema_every steps"],
            ["update traffic per step", f"{xl_traffic / 1e9:.1f} GB",
             f"{xl_traffic / 3.35e12 * 1e3:.1f} ms at an H100's 3.35 TB/s; {cpu_xl_s:.2f} s at this CPU's measured rate"]]
    print(table(["DiT-XL/2", "size", "note"], rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stds": args.stds, "demo": {"trained": trained, "frozen": frozen, "ema_update_s": ema_s,
                                                   "phema_update_s": phema_s, "train_step_off_s": off_s,
                                                   "train_step_on_s": on_s, "snapshots": snaps},
                       "dit_xl_2": {"trained": xl_trained, "frozen": xl_frozen, "update_bytes": xl_traffic,
                                    "snapshot_fp16_bytes": snapshot_bytes(xl_trained, xl_frozen_bytes, n, "fp16")}},
                      f, indent=1)


if __name__ == "__main__":
    main()
