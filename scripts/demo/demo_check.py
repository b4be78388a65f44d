#!/usr/bin/env python
"""Does `dit demo` meet its promise: >= 97% recognisable digits in <= 3 minutes end to end?

Usage: python scripts/demo/demo_check.py [--seed 0] [--steps N] [--objective transport] [--out DIR]
                                        [--max-seconds 180] [--min 0.97]
       python scripts/demo/demo_check.py --score DIR [--min 0.97]

Runs `dit demo` (as `python -m dit_trainer demo`, this checkout's src first on the path) in a
subprocess with a fresh output folder, timing the whole command: interpreter start, imports,
training, sampling, saving. Then scores the folder's samples.npz: a classifier fit on the real 8×8
digits labels each box-downsampled sample, and the share it labels as the requested class is printed
per class and overall, beside the same classifier's accuracy on held-out real digits sent through
the samples' path (the ceiling), and the FID against the real digits the demo logged. Prints the
wall seconds, the share recognised, the demo's steps, batch and precision, and the date, CPU name
and load average (the load says whether the timing was taken on a busy machine). `--score DIR` only
scores an existing demo folder. Exits 0 when the goals are met, 1 when one is missed, 2 when the
demo failed or its samples are unusable.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))


class Unusable(Exception):
    """The samples cannot be scored; the message says why."""


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


def score(folder) -> float:
    """Print how many of `folder`/samples.npz the real-digit classifier labels as asked; the overall share."""
    from dit_trainer.data.digits import classify_images, digits_classifier, load_digit_arrays, upsample_digits
    from dit_trainer.errors import DitError
    from dit_trainer.sample.images import from_adm_images

    path = Path(folder) / "samples.npz"
    if not path.is_file():
        raise Unusable(f"{path} does not exist; run the demo first or pass its output folder")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "arr_0" not in npz or "arr_1" not in npz:
                raise Unusable(f"{path} needs the ADM arrays 'arr_0' (images) and 'arr_1' (labels), has "
                               f"{sorted(npz.files)}; re-run the demo")
            arr, labels = npz["arr_0"], npz["arr_1"].reshape(-1)
            if arr.dtype != np.uint8 or arr.ndim != 4:
                raise Unusable(f"{path}: arr_0 must be uint8 N×H×W×C images, is {arr.dtype} of shape {arr.shape}")
            images = from_adm_images(arr, channels=1)  # the digits are gray: N×1×S×S in [-1, 1]
    except (OSError, ValueError) as err:
        raise Unusable(f"cannot read {path} ({err}); re-run the demo") from None
    if len(labels) != len(images) or len(images) == 0:
        raise Unusable(f"{path}: {len(images)} images but {len(labels)} labels; expected one label per image")
    if labels.dtype.kind not in "iu" or labels.min() < 0 or labels.max() > 9:
        raise Unusable(f"{path}: labels must be integers 0..9")
    try:
        clf = digits_classifier()
        pred = classify_images(images, clf)
        # The same classifier on held-out real digits sent through the samples' path (upsampled to S,
        # then box-downsampled) is the ceiling the samples can reach.
        real8, real_labels = load_digit_arrays()
        held, size = clf.holdout_indices_, images.shape[-1]
        ceiling = float((classify_images(upsample_digits(real8[held], size), clf) == real_labels[held]).mean())
    except (DitError, ValueError) as err:
        raise Unusable(f"{path}: {err}") from None
    print(f"{path}: {len(images)} samples, {size}x{size}")
    print("class  samples  correct  share")
    for c in range(10):
        mask = labels == c
        hits = int((pred[mask] == c).sum())
        print(f"{c:>5}  {int(mask.sum()):>7}  {hits if mask.any() else '-':>7}  "
              f"{f'{hits / mask.sum():.3f}' if mask.any() else '-':>5}")
    print(f"reference: classifier accuracy on {len(held)} held-out real digits: "
          f"{clf.holdout_accuracy_:.3f} at 8x8, {ceiling:.3f} via {size}x{size}")
    return float((pred == labels).mean())


def score_or_report(folder):
    """score(folder), or None after one line on stderr when its samples are unusable."""
    try:
        return score(folder)
    except Unusable as err:
        print(f"demo_check: error: {err}", file=sys.stderr)
        return None


def verdict(share: float, goal: float) -> str:
    """The recognised line of the report."""
    return f"recognised:  {share:.1%}  goal >= {goal:.0%}  {'met' if share >= goal else 'MISSED'}"


def main(argv=None) -> int:
    """Run the demo, score it, print the numbers and return the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="the demo's --seed")
    p.add_argument("--steps", type=int, default=None, help="the demo's --steps (default: the demo's own)")
    p.add_argument("--objective", choices=("diffusion", "transport"), default=None,
                   help="the demo's --objective (default: the demo's own)")
    p.add_argument("--out", default=None, help="output folder; must not exist (default: a fresh temporary one)")
    p.add_argument("--max-seconds", type=float, default=180.0, help="wall-clock goal (default 180)")
    p.add_argument("--min", type=float, default=0.97, dest="min_share", help="recognised-share goal (default 0.97)")
    p.add_argument("--score", metavar="DIR", default=None, help="only score the samples of an existing demo folder")
    args = p.parse_args(argv)
    if args.score is not None:
        share = score_or_report(args.score)
        if share is None:
            return 2
        print(verdict(share, args.min_share))
        return 0 if share >= args.min_share else 1

    if args.out is not None and Path(args.out).exists():
        print(f"demo_check: error: --out {args.out} exists; pass a new folder (the demo would resume from it)",
              file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="demo_check_")) / "run"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))

    from dit_trainer.demo import DEMO_OBJECTIVE, demo_config  # the numbers the subprocess will run with

    args.objective = args.objective or DEMO_OBJECTIVE

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
    share = score_or_report(out)
    if share is None:
        return 2
    trained = re.search(r"trained (\d+) steps in (\d+) s", demo.stdout)
    fid = re.search(r"FID against the real digits \((.*)\): ([0-9.]+)", demo.stdout)

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
    print(verdict(share, args.min_share))
    if fid:
        print(f"fid:         {fid.group(2)} against the 1,797 real digits ({fid.group(1)})")
    print(f"output:      {out}")
    return 0 if time_ok and share_ok else 1


if __name__ == "__main__":
    sys.exit(main())
