"""Guidance kinds and weights on a `dit demo` run: FID, precision, recall and the share recognised.

    python benchmarks/demo_guidance.py RUN OUT [--num-samples 1000] [--steps 9]

RUN is a finished `dit demo --out RUN --seed S` folder (SiT, post-hoc EMA widths 0.05 and 0.10 tracked;
the demo rebuilt the 0.05 profile at the last step and the 0.10 one halfway). Every row is `dit sample-ddp
--ckpt RUN --guidance SPEC ... --ref digits --network digits` with the same sampler (midpoint ODE,
`--steps` steps), the run's own recommendation switched off first (guidance 1, no guide, no interval) so
that each SPEC says all that differs: the raw weights (`ema=none`) and the post-hoc EMA 0.05 under
classifier-free guidance, autoguidance by the run's 0.10 profile halfway, the guidance interval, and the
demo's recommended mix. Then the share of each batch that a digit classifier (fit on the real digits)
labels as the class asked for. Finished batches are reused when OUT already holds them.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _common import table  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def specs(guide: str) -> list:
    """The table's SPECs, from no guidance on the raw weights to the demo's recommendation."""
    ema = "ema=0.05"
    return ["cfg=1,ema=none", "cfg=1.5,ema=none", f"cfg=1,{ema}", f"cfg=1.2,{ema}", f"cfg=1.5,{ema}",
            f"cfg=1.3,interval=1:inf,{ema}", f"guide={guide},w=1.5,{ema}", f"guide={guide},w=2,{ema}",
            f"guide={guide},w=3,interval=1:inf,{ema}", f"cfg=1.1,guide={guide},w=2,interval=1:inf,{ema}"]


def main(argv=None) -> int:
    """Run the sweep, add the recognised share, print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a finished dit demo folder")
    p.add_argument("out", help="where the batches and rows.json go")
    p.add_argument("--num-samples", type=int, default=1000)
    p.add_argument("--steps", type=int, default=9, help="midpoint steps of every row")
    args = p.parse_args(argv)
    from dit_trainer.demo import GUIDE, recognised

    run, out = Path(args.run).resolve(), Path(args.out)
    guide = GUIDE  # the run's 0.10 profile halfway, as the demo names it (rebuilt when missing)
    rows_file = out / "rows.json"
    cmd = [sys.executable, "-m", "dit_trainer", "sample-ddp", "--ckpt", str(run), "--npz", str(out / "s.npz"),
           "--num-samples", str(args.num_samples), "--batch-size", "250", "--steps", str(args.steps),
           "--device", "cpu", "--no-progress", "--ref", "digits", "--network", "digits", "--json", str(rows_file),
           "--cfg-scale", "1", "--guide-scale", "1", "--guidance-interval", "0", "inf",
           "--guidance", *specs(guide)]
    done = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if done.returncode:
        return done.returncode
    rows = json.loads(rows_file.read_text())
    body = [[r["guidance"].replace(guide, "halfway"), f"{r['nfe']:.0f}", f"{r['fid']:.2f}",
             f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{recognised(r['samples']):.1%}"] for r in rows]
    print(table(["guidance (ema: post-hoc width; none: raw weights)", "NFE", "FID", "precision", "recall",
                 "recognised"], body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
