"""The first training step of a per-block-compiled DiT, cold against warm (`train.compile_cache`).

    python benchmarks/compile_cache.py                               # DiT-S/2, 32x32x4 latents, batch 2, CPU
    python benchmarks/compile_cache.py --model DiT-XL/2 --device cuda --mixed-precision bf16 --batch-size 32

Each run is a fresh process, as a restart is: a `DiTTrainer` with `train.compile true` and
`train.compile_cache` pointed at one folder, whose first `queue_step` (the blocks' forward and
backward compile, then the step) and second step are timed. Cold: the folder is empty (a new
temporary one per repeat, so torch's caches in /tmp or ~ play no part). Warm: the same folder again,
filled by the cold run. The table gives the median of `--repeats` pairs of each and the ratio of the
first steps, warm over cold; a steady step is printed too, so the compile's own share can be read
(first step minus steady step). The default batch is small (2) and the runs use one thread, so
the step's own compute, which a shared CPU's load inflates most, stays small beside the compile,
as it is on a GPU (DiT-XL/2's step takes well under a second against a minute of compile).
The runs' TMPDIR is a temporary folder, so nothing of torch's
default cache (/tmp/torchinductor_USER) is reused. The FX graph and AOTAutograd cache hit counts
of the warm run say what it reused.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(args) -> None:
    """One run: build the trainer, time the first two steps, print one JSON line."""
    import torch
    from torch._dynamo.utils import counters

    from dit_trainer.train import DiTTrainer

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    trainer = DiTTrainer({
        "output_dir": args.output_dir,
        "model": {"name": args.model, "input_size": args.input_size, "in_channels": 4, "num_classes": 1000},
        "data": {"num_workers": 0},
        "train": {"global_batch_size": args.batch_size, "device": args.device, "compile": "true",
                  "mixed_precision": args.mixed_precision, "compile_cache": args.cache},
        "logging": {"progress": False, "tensorboard": False},
    })
    built = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(args.batch_size, 4, args.input_size, args.input_size, generator=g).to(trainer.device),
             torch.randint(0, 1000, (args.batch_size,), generator=g).to(trainer.device))
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        trainer.queue_step(batch)
        trainer.update.read_losses()  # waits for the step's device work
        times.append(time.perf_counter() - t0)
    print(json.dumps({"build": built - started, "first": times[0], "steady": times[1],
                      "inductor": dict(counters["inductor"]), "aot_autograd": dict(counters["aot_autograd"]),
                      "folder": str(trainer.compile_cache)}))


def run_once(args, cache: Path, scratch: Path) -> dict:
    """One fresh process on `cache`; its TMPDIR is `scratch`."""
    cmd = [sys.executable, __file__, "--child", "--cache", str(cache), "--output-dir", str(scratch / "run"),
           "--model", args.model, "--input-size", str(args.input_size), "--batch-size", str(args.batch_size),
           "--device", args.device, "--mixed-precision", args.mixed_precision, "--threads", str(args.threads)]
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(name, None)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"compile_cache.py: the {args.model} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="DiT-S/2")
    p.add_argument("--input-size", type=int, default=32, help="latent side (32: 256-px images)")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    p.add_argument("--device", default="cpu")
    p.add_argument("--mixed-precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--repeats", type=int, default=1, help="cold/warm pairs; the table gives medians")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    p.add_argument("--output-dir", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import table

    load_before = os.getloadavg()[0]
    cold, warm = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="dit-compile-cache-") as tmp:
            tmp = Path(tmp)
            (tmp / "cold").mkdir()
            (tmp / "warm").mkdir()
            cold.append(run_once(args, tmp / "cache", tmp / "cold"))
            warm.append(run_once(args, tmp / "cache", tmp / "warm"))
    load = f"{load_before:.2f} before, " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " after (1/5/15 min)"
    print(f"# benchmarks/compile_cache.py  {datetime.datetime.now():%Y-%m-%d %H:%M}  {args.model} "
          f"{args.input_size}x{args.input_size}x4 batch {args.batch_size} {args.mixed_precision} on {args.device}  "
          f"{os.cpu_count()} CPUs, {args.threads} torch thread(s)  loadavg {load}  ({args.repeats} pair(s), medians)")
    rows = []
    for name, runs in (("cold (empty cache)", cold), ("warm (same cache)", warm)):
        med = {k: statistics.median(r[k] for r in runs) for k in ("build", "first", "steady")}
        hits = runs[-1]["inductor"].get("fxgraph_cache_hit", 0)
        misses = runs[-1]["inductor"].get("fxgraph_cache_miss", 0)
        aot = runs[-1]["aot_autograd"].get("autograd_cache_hit", 0)
        rows.append([name, f"{med['build']:.1f}", f"{med['first']:.1f}", f"{med['steady']:.2f}",
                     f"{med['first'] - med['steady']:.1f}", f"{hits}/{misses}", str(aot)])
    print(table(["run", "build s", "first step s", "steady step s", "compile s", "FX graph hit/miss",
                 "AOT hits"], rows))
    first_cold = statistics.median(r["first"] for r in cold)
    first_warm = statistics.median(r["first"] for r in warm)
    # As the table's compile column: median first step less median steady step.
    overhead = [statistics.median(r["first"] for r in runs) - statistics.median(r["steady"] for r in runs)
                for runs in (cold, warm)]
    # One line gpu_check.py's summary takes as it is.
    print(f"compile cache {args.model} batch {args.batch_size} {args.mixed_precision}: first step cold {first_cold:.1f} s, "
          f"warm {first_warm:.1f} s = {first_warm / first_cold:.0%} of cold (the compile alone, first minus steady "
          f"step: {overhead[1] / overhead[0]:.0%})")


if __name__ == "__main__":
    main()
