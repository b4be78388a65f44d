"""What each attribute word of `dit demo --text` does to a trained run's samples.

    python benchmarks/demo_text_words.py --run OUT [--digits 2 7] [--n 100] [--seed 1] [--cfg-scale 1]

For each digit, the same `--n` noises are drawn (as the run's `sample:` section recommends) for captions
that say both middle values ("a regular upright seven"), one of them, neither ("a seven"), and each
extreme of weight beside "upright". Each sample's stroke weight and slant are placed among the real
digits of the asked digit (a within-digit rank, 0..1, as the captions' margin measures it); a row prints
their mean and spread and how the samples fall into the three tertiles (thin / regular / bold, left /
upright / right). A word the model follows moves its attribute's rank and narrows it; a word it ignores
leaves the row where the caption without it is.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# (label, weight, slant) per row: None leaves the attribute unsaid.
ROWS = (("both middle values", 1, 1), ("slant word only", None, 1), ("weight word only", 1, None),
        ("digit alone", None, None), ("thin, upright", 0, 1), ("bold, upright", 2, 1))


def rank_among(values, reference) -> np.ndarray:
    """Each value's share of `reference` below it (0..1)."""
    ordered = np.sort(reference)
    return np.searchsorted(ordered, values) / len(ordered)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a trained text demo's output folder")
    p.add_argument("--digits", type=int, nargs="+", default=[2, 7])
    p.add_argument("--n", type=int, default=100, help="samples per caption")
    p.add_argument("--seed", type=int, default=1, help="the noises' seed (the same for every caption)")
    p.add_argument("--cfg-scale", type=float, default=None, help="guidance weight (default: the run's)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from dit_trainer.data.digit_attributes import caption, classify, digit_captions, measure
    from dit_trainer.demo_text import sample_prompts, sampling_run

    known = digit_captions()  # the real digits as the captions measured them (a rank within a digit is the same
    mass, lean = known.mass, known.lean  # for ink mass as for mass over the digit's median)
    given = {} if args.cfg_scale is None else {"cfg_scale": args.cfg_scale}
    run = sampling_run(args.run, "cpu", **given)
    print(f"# benchmarks/demo_text_words.py --run {args.run}  {args.n} samples per caption, noise seed {args.seed}, "
          f"sampled as the run recommends{'' if not given else f', but guidance {args.cfg_scale}'}")
    print("| digit | caption | says | weight rank | thin / regular / bold | slant rank | left / upright / right |")
    print("|--:|:--|:--|--:|:--|--:|:--|")
    for d in args.digits:
        mine = known.digits == d
        # The training images of the digit (its held-out triple left out): where "a seven" should land.
        train = mine & ~known.held_out
        print(row(d, "(the training images)", "data", rank_among(mass[train], mass[mine]),
                  rank_among(lean[train], lean[mine]), known.weights[train], known.slants[train]))
        for label, weight, slant in ROWS:
            prompt = caption(d, weight, slant)
            images = sample_prompts(run, [prompt] * args.n, seed=args.seed).numpy()
            m, s = measure(images)
            w_cls, s_cls = classify(m, s, np.full(args.n, d), known.thresholds)
            print(row(d, prompt, label, rank_among(m, mass[mine]), rank_among(s, lean[mine]), w_cls, s_cls), flush=True)
    return 0


def row(digit, prompt, label, w_rank, s_rank, w_cls, s_cls) -> str:
    """One table row: each attribute's rank (mean ± std) and its tertile shares."""
    def shares(cls):
        return " / ".join(f"{c:.0%}" for c in np.bincount(cls, minlength=3) / len(cls))

    return (f"| {digit} | {prompt} | {label} | {w_rank.mean():.2f} ± {w_rank.std():.2f} | {shares(w_cls)} | "
            f"{s_rank.mean():.2f} ± {s_rank.std():.2f} | {shares(s_cls)} |")


if __name__ == "__main__":
    sys.exit(main())
