"""FID of the digits demo's samples (digit network) after N training steps, for the README.

    python scripts/demo/fid_vs_steps.py [--steps 1000 2000] [--per-class 100] [--out outputs/digits_fid]

First the yardsticks: 500 real digits against all 1,797 (the demo's reference), 1,000 real digits (a
fixed random draw) split in two halves of 500, and 500 real digits against 500 uniform-noise images.
Then it trains the demo once per step count (its config, seed 0), draws per-class × 10 samples as
the demo does (as the run recommends: its `sample:` section), and runs `dit eval --network digits
--ref digits` on them; then samples the same number with `dit sample-ddp` at the field's fixed
measure (guidance 1.5 alone, the checkpoint's own EMA weights, 25 steps) and evaluates those. Prints
two lines per step count.
"""

import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))


def baselines():
    """FID etc. of real halves and of real against noise, printed."""
    from dit_trainer.evaluate.digits_net import load_digit_net, real_digits_uint8
    from dit_trainer.evaluate.features import extract_features
    from dit_trainer.evaluate.fid import frechet_distance
    from dit_trainer.evaluate.inception_score import inception_score
    from dit_trainer.evaluate.precision_recall import precision_recall
    from dit_trainer.evaluate.stats import gaussian_stats

    net = load_digit_net()
    rng = np.random.default_rng(0)
    real = real_digits_uint8(rng.permutation(1797)[:1000])
    noise = rng.integers(0, 256, size=(500,) + real.shape[1:], dtype=np.uint8)
    a, b, n = (extract_features(net, x, batch_size=512, progress=False) for x in (real[:500], real[500:], noise))
    # The demo's own end-of-run FID compares 500 samples with the statistics of all 1,797 digits.
    every = extract_features(net, real_digits_uint8(), batch_size=512, progress=False)
    fid_all = frechet_distance(*gaussian_stats(a.pool), *gaussian_stats(every.pool))
    print(f"real 500 vs all 1,797 real (the demo's reference, which holds them): FID {fid_all:.2f}", flush=True)
    for name, other in (("real 500 vs real 500", b), ("real 500 vs noise 500", n)):
        fid = frechet_distance(*gaussian_stats(a.pool), *gaussian_stats(other.pool))
        sfid = frechet_distance(*gaussian_stats(a.spatial), *gaussian_stats(other.spatial))
        prec, rec = precision_recall(a.pool, other.pool)
        print(f"{name}: FID {fid:.2f}  sFID {sfid:.2f}  IS of the second set {inception_score(other.logits)[0]:.2f}  "
              f"precision {prec:.3f}  recall {rec:.3f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="*", default=[1000, 2000], help="none: only the yardsticks")
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--out", default="outputs/digits_fid")
    args = p.parse_args()

    from dit_trainer.demo import run_demo
    from dit_trainer.evaluate.evaluator import evaluate

    baselines()
    rows = []
    for steps in args.steps:
        out = pathlib.Path(args.out) / f"steps-{steps}"
        summary = run_demo(out, steps=steps, per_class=args.per_class, progress=False, fid_samples=10 * args.per_class)
        # The demo's samples.npz (drawn as the run recommends) is the ADM format `dit eval` reads.
        m = evaluate(out / "samples.npz", "digits", network="digits", device="cpu", progress=False)
        m.update(steps=steps, train_seconds=round(summary["train_seconds"]), recognised=summary.get("recognised"))
        rows.append(m)
        print(f"steps {steps}, the demo's samples ({summary['sampling']}): FID {m['fid']:.2f}  sFID {m['sfid']:.2f}  "
              f"IS {m['inception_score']:.2f}  precision {m['precision']:.3f}  recall {m['recall']:.3f}  "
              f"(SVC recognises {m['recognised']:.0%}, {m['num_samples']} samples, trained {m['train_seconds']} s)",
              flush=True)
        # The field's fixed measure: sample-ddp with guidance 1.5 alone (no guide, no interval, the checkpoint's
        # own EMA weights), then eval.
        from dit_trainer.cli import main as dit

        npz = out / "eval.npz"
        dit(["sample-ddp", "--ckpt", str(out), "--npz", str(npz), "--num-samples", str(10 * args.per_class),
             "--batch-size", "250", "--cfg-scale", "1.5", "--guide-scale", "1", "--guidance-interval", "0", "inf",
             "--ema-std", "none", "--steps", "25", "--device", "cpu", "--no-progress"])
        e = evaluate(npz, "digits", network="digits", device="cpu", progress=False)
        e.update(steps=steps, protocol="sample-ddp cfg 1.5")
        rows.append(e)
        print(f"steps {steps}, sample-ddp + eval (guidance 1.5, uniform labels): FID {e['fid']:.2f}  "
              f"sFID {e['sfid']:.2f}  IS {e['inception_score']:.2f}  precision {e['precision']:.3f}  "
              f"recall {e['recall']:.3f}", flush=True)
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(args.out) / "metrics.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
