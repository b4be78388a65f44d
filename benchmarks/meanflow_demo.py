"""How the MeanFlow digits demo's settings were chosen: train `dit demo --objective meanflow`'s config with
overrides, then score 1- and 2-step samples of several post-hoc EMA widths at several steps of the run.

    python benchmarks/meanflow_demo.py --seed 1 --out /tmp/mf_s1 [--set meanflow.omega=1.5 ...]
        [--steps 800] [--every 100] [--at 400,600,800] [--widths 0.05,0.10] [--sample-steps 1,2] [--scales 1.1,1.3]
    python benchmarks/meanflow_demo.py --score-only --out /tmp/mf_s1 ...    # a finished run, scored again

Each row: the snapshot step, the EMA width, the sampler's steps, FID against the real digits (digit network,
1,000 samples, every class alike, seed 0 noise and the step counts' schedules as the demo draws) and the share
a digit classifier recognises, with the training seconds so far. Rows are also appended to OUT/scores.jsonl.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def _value(text):
    """A command-line value as YAML reads it (numbers, booleans, lists)."""
    import yaml

    return yaml.safe_load(text)


def configure(args) -> dict:
    """The demo's MeanFlow config, snapshots every `--every` steps, with the `--set` overrides."""
    from dit_trainer.demo import demo_config

    cfg = demo_config(args.out, args.steps, args.seed, objective="meanflow", fid_samples=args.num)
    cfg["train"]["phema_every"] = args.every
    cfg["checkpoint"]["save_steps"] = args.steps
    cfg["logging"]["progress"] = False
    for item in args.set:
        key, _, text = item.partition("=")
        *path, leaf = key.split(".")
        node = cfg
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = _value(text)
    return cfg


def score(out, step, width, sample_steps, num, device, scale=None) -> list:
    """[(sampler steps, fid, recognised)] of `num` samples from the EMA of `width` rebuilt at `step`, at guidance
    scale `scale` (a run with meanflow.omega_range; None: the run's own sample.cfg_scale)."""
    from dit_trainer.demo import measure
    from dit_trainer.meanflow.demo import SCHEDULES
    from dit_trainer.objective import build_objective
    from dit_trainer.phema import reconstruct
    from dit_trainer.sample.decode import load_decoder, to_images
    from dit_trainer.sample.images import save_npz
    from dit_trainer.sample.loading import load_model
    from dit_trainer.sample.sampling import sample_latents

    (folder,) = reconstruct(out, [width], at_step=step)
    model, cfg = load_model(folder)
    objective = build_objective(cfg)
    labels = np.arange(num) % model.num_classes
    rows = []
    for k in sample_steps:
        timesteps = list(SCHEDULES[k]) if k in SCHEDULES else None  # the demo's schedule where it has one
        x = sample_latents(model, objective, labels, cfg_scale=cfg.sample.cfg_scale if scale is None else scale,
                           steps=k, seed=0, device=device, timesteps=timesteps)
        npz = save_npz(Path(out) / "scored.npz", to_images(x, *load_decoder(cfg, device=device)), labels)
        m = measure(npz, device)
        rows.append((k, m["fid"], m["recognised"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--at", default="", help="snapshot steps to score (default: the last)")
    ap.add_argument("--widths", default="0.05,0.1")
    ap.add_argument("--sample-steps", default="1,2")
    ap.add_argument("--num", type=int, default=1000)
    ap.add_argument("--set", action="append", default=[], help="dotted.key=value over the demo's config")
    ap.add_argument("--scales", default="", help="guidance scales to sample at, for a run with meanflow.omega_range "
                    "(default: the run's own)")
    ap.add_argument("--score-only", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch

    from dit_trainer.config import build_config
    from dit_trainer.train import DiTTrainer

    torch.set_num_threads(args.threads)
    cfg = build_config(configure(args))
    seconds = None
    if not args.score_only:
        trainer = DiTTrainer(cfg)
        t0 = time.perf_counter()
        trainer.train(max_steps_name="--steps")
        seconds = time.perf_counter() - t0
    at = [int(s) for s in args.at.split(",") if s] or [args.steps]
    widths = [float(w) for w in args.widths.split(",")]
    sample_steps = [int(k) for k in args.sample_steps.split(",")]
    print(f"# seed {args.seed}, {args.steps} steps{f' in {seconds:.0f} s' if seconds else ''}; sets: "
          f"{' '.join(args.set) or 'none'}")
    scales = [float(s) for s in args.scales.split(",") if s] or [None]
    print("| step | EMA width | scale | sampler steps | FID | recognised |\n|--:|--:|--:|--:|--:|--:|")
    with open(Path(args.out) / "scores.jsonl", "a") as log:
        for step in at:
            for width in widths:
                for scale in scales:
                    for k, fid, rec in score(args.out, step, width, sample_steps, args.num, torch.device("cpu"),
                                             scale):
                        print(f"| {step} | {width} | {scale or 'run'} | {k} | {fid:.2f} | {rec:.1%} |", flush=True)
                        log.write(json.dumps({"seed": args.seed, "sets": args.set, "step": step, "width": width,
                                              "scale": scale, "sample_steps": k, "fid": fid, "recognised": rec,
                                              "train_seconds": seconds}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
