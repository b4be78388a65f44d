#!/usr/bin/env python
"""Does `dit demo` meet its promise: >= 97% recognisable digits in <= 3 minutes end to end?

Usage: python scripts/demo_check.py [--seed 0] [--steps N] [--objective diffusion] [--out DIR] [--max-seconds 180]
                                   [--min 0.97]

Runs `dit demo` (as `python -m dit_trainer demo`, this checkout's src first on the path) in a
subprocess with a fresh output folder, timing the whole command: interpreter start, imports,
training, sampling, saving. Then runs `scripts/check_digits.py` on the folder. Prints the wall
seconds, the share recognised, the demo's steps, batch and precision, and the date, CPU name and
load average (the load says whether the timing was taken on a busy machine). Exits 0 when both
goals are met, 1 when either is missed, 2 when the demo or the check failed to run.
"""

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one) and the core count."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, or 'n/a' where the OS has none."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (OSError, AttributeError):
        return "n/a"


def main(argv=None) -> int:
    """Run the demo, score it, print the numbers and return the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="the demo's --seed")
    p.add_argument("--steps", type=int, default=None, help="the demo's --steps (default: the demo's own)")
    p.add_argument("--objective", choices=("diffusion", "transport"), default="diffusion",
                   help="the demo's --objective")
    p.add_argument("--out", default=None, help="output folder; must not exist (default: a fresh temporary one)")
    p.add_argument("--max-seconds", type=float, default=180.0, help="wall-clock goal (default 180)")
    p.add_argument("--min", type=float, default=0.97, dest="min_share", help="recognised-share goal (default 0.97)")
    args = p.parse_args(argv)

    if args.out is not None and Path(args.out).exists():
        print(f"demo_check: error: --out {args.out} exists; pass a new folder (the demo would resume from it)",
              file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="demo_check_")) / "run"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))

    from dit_trainer.demo import demo_config  # the numbers the subprocess will run with

    steps = {} if args.steps is None else {"steps": args.steps}
    train = demo_config(out, seed=args.seed, objective=args.objective, **steps)["train"]
    load_before = loadavg()
    cmd = [sys.executable, "-m", "dit_trainer", "demo", "--out", str(out), "--seed", str(args.seed),
           "--objective", args.objective, "--no-progress"]
    if args.steps is not None:
        cmd += ["--steps", str(args.steps)]
    t0 = time.perf_counter()
    demo = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    load_after = loadavg()
    if demo.returncode != 0:
        print(demo.stdout + demo.stderr, file=sys.stderr)
        print(f"demo_check: error: `{' '.join(cmd)}` exited {demo.returncode}", file=sys.stderr)
        return 2
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_digits.py"), str(out), "--min", "0"],
                           env=env, capture_output=True, text=True)
    found = re.search(r"overall share labelled as their own class: ([0-9.]+)", check.stdout)
    if check.returncode != 0 or not found:
        print(check.stdout + check.stderr, file=sys.stderr)
        print("demo_check: error: scripts/check_digits.py did not report a share", file=sys.stderr)
        return 2
    share = float(found.group(1))
    trained = re.search(r"trained (\d+) steps in (\d+) s", demo.stdout)

    time_ok, share_ok = wall <= args.max_seconds, share >= args.min_share
    print(f"date:        {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC")
    print(f"cpu:         {cpu_name()}")
    print(f"loadavg:     {load_before} before, {load_after} after (1/5/15 min)")
    print(f"demo:        {' '.join(cmd[1:])}")
    print(f"config:      {train['max_steps']} steps, batch {train['global_batch_size']}, {train['mixed_precision']}, "
          f"seed {args.seed}, objective {args.objective}")
    if trained:
        print(f"training:    {trained.group(1)} steps in {trained.group(2)} s (the rest: start, sampling, saving)")
    print(f"wall:        {wall:.1f} s  goal <= {args.max_seconds:.0f} s  {'met' if time_ok else 'MISSED'}")
    print(f"recognised:  {share:.1%}  goal >= {args.min_share:.0%}  {'met' if share_ok else 'MISSED'}")
    print(f"output:      {out}")
    return 0 if time_ok and share_ok else 1


if __name__ == "__main__":
    sys.exit(main())
