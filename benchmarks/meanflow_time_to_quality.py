"""Time to quality, sampling counted: the MeanFlow digits demo against the SiT demo it replaces, in wall-clock.

    python benchmarks/meanflow_time_to_quality.py --seed 4 --out /tmp/mf_ttq [--every 100] [--num 1000]
        [--flow-steps 1200] [--meanflow-steps N] [--flow-sampler-steps 9] [--threads 2]

Both demos train in this process, one after the other, with post-hoc EMA snapshots every `--every` steps
(`dit demo`'s configs otherwise: the SiT demo's 1,200 steps, the MeanFlow demo's own length). At each
snapshot the EMA of width 0.05 draws `--num` samples, every class alike from the same noise (seed 0), with
each objective's sampler: the SiT demo's midpoint ODE unguided at `--flow-sampler-steps` steps (9: 16
network evaluations, where its FID stops improving), MeanFlow at 1 and 2 steps. Sampling is timed (the
network's time to draw them), and each batch scored as the demo scores: FID against the real digits
(digit network) and the share the digit classifier recognises.

The table gives training seconds (the step times each demo's seconds per step, probed in this process with
the two demos' steps alternating, so a machine whose speed drifts between the long runs cannot favour
either) beside the sampling seconds. Below it, for each target
FID (each recipe's own at the end), the first point of every recipe at or below it and its cost:
training plus sampling `--num` images, what every further 1,000 images cost to sample, and the number
of images beyond which it costs less in all than every other recipe at that quality. Finished runs in
`--out` are reused; scores are computed anew.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def train_run(folder: Path, objective: str, steps: int, seed: int, every: int, num: int) -> float:
    """Train the demo of `objective` into `folder` (reused when finished): its median seconds per step."""
    from dit_trainer.config import build_config
    from dit_trainer.demo import demo_config
    from dit_trainer.train import DiTTrainer

    done = folder / "checkpoints" / f"step-{steps:08d}"
    if not done.is_dir():
        cfg = demo_config(folder, steps, seed, objective=objective, fid_samples=num)
        cfg["train"]["phema_every"] = every
        cfg["checkpoint"].update(save_steps=steps, resume=False, on_existing="overwrite")
        cfg["logging"]["progress"] = False
        DiTTrainer(build_config(cfg)).train(max_steps_name="--steps")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if '"s_per_step"' in line]
    return statistics.median(r["s_per_step"] for r in rows[1:] or rows)  # the first window holds the warm-up


def probe(out: Path, plans: list, seed: int, steps: int = 16, warmup: int = 3) -> dict:
    """Each demo's seconds per step from short runs alternating step by step in this process (median of
    `steps` after `warmup`): a machine whose speed drifts between the long runs slows both alike here."""
    from dit_trainer.config import build_config
    from dit_trainer.demo import demo_config
    from dit_trainer.train import DiTTrainer

    trainers = {}
    for _, objective, run_steps, _ in plans:
        cfg = demo_config(out / f"probe-{objective}", run_steps, seed, objective=objective)
        cfg["checkpoint"].update(resume=False, on_existing="overwrite")
        cfg["logging"]["progress"] = False
        trainer = DiTTrainer(build_config(cfg))
        trainer.loader = trainer.build_loader()
        trainers[objective] = trainer
    times = {objective: [] for objective in trainers}
    for i in range(warmup + steps):
        for objective, trainer in trainers.items():
            batch = next(trainer.loader)
            t0 = time.perf_counter()
            trainer.train_step(batch)
            if i >= warmup:
                times[objective].append(time.perf_counter() - t0)
    return {objective: statistics.median(t) for objective, t in times.items()}


def score(folder: Path, step: int, sampler_steps: int, num: int, device) -> dict:
    """{nfe, sample_s, fid, recognised} of `num` samples from the width-0.05 EMA at `step`, unguided."""
    import torch

    from dit_trainer.demo import measure
    from dit_trainer.objective import build_objective
    from dit_trainer.phema import reconstruct
    from dit_trainer.sample.decode import load_decoder, to_images
    from dit_trainer.sample.images import save_npz
    from dit_trainer.sample.loading import load_model
    from dit_trainer.sample.sampling import sample_latents

    from dit_trainer.meanflow.demo import SCHEDULES

    (weights,) = reconstruct(folder, [0.05], at_step=step)
    model, cfg = load_model(weights)
    objective = build_objective(cfg)
    # MeanFlow samples on the demo's schedule for its step count, as `dit demo` does.
    schedule = {"timesteps": list(SCHEDULES[sampler_steps])} if cfg.objective == "meanflow" else {}
    labels = np.arange(num) % model.num_classes
    counter = {}
    t0 = time.perf_counter()
    with torch.inference_mode():
        x = sample_latents(model, objective, labels, cfg_scale=1.0, steps=sampler_steps, seed=0, device=device,
                           counter=counter, **schedule)
    sample_s = time.perf_counter() - t0
    npz = save_npz(folder / "scored.npz", to_images(x, *load_decoder(cfg, device=device)), labels)
    m = measure(npz, device)
    return {"nfe": counter.get("nfe"), "sample_s": sample_s, "fid": m["fid"], "recognised": m["recognised"]}


def first_at(points: list, target: float):
    """The first point (in training order) whose FID is at or below `target`, or None."""
    return next((p for p in points if p["fid"] <= target), None)


def break_even(hit: dict, hits: dict, num: int) -> str:
    """The image count beyond which `hit` costs less in all than every other recipe that reaches the target
    ("always" when it costs less from the start, "never" when a recipe with a cheaper sampler costs less)."""
    total = hit["train_s"] + hit["sample_s"]
    beyond = 0.0
    for other in hits.values():
        if other is None or other is hit:
            continue
        gap, saving = total - other["train_s"] - other["sample_s"], (other["sample_s"] - hit["sample_s"]) / num
        if gap <= 0 and saving >= 0:
            continue
        if saving <= 0:
            return "never"
        beyond = max(beyond, num + gap / saving)
    return "always" if beyond == 0 else f"{beyond:,.0f} images"


def report(points: list, num: int) -> str:
    """The measured points, then for each target every recipe's first point at or below it and its cost."""
    lines = ["| recipe | NFE | step | train s | sample s | FID | recognised |", "|:--|--:|--:|--:|--:|--:|--:|"]
    lines += [f"| {p['recipe']} | {p['nfe']} | {p['step']} | {p['train_s']:.0f} | {p['sample_s']:.2f} | {p['fid']:.2f} | "
              f"{p['recognised']:.1%} |" for p in points]
    curves = {}
    for p in points:
        curves.setdefault((p["recipe"], p["nfe"]), []).append(p)
    for (recipe, nfe), curve in curves.items():
        target = curve[-1]["fid"]
        lines += ["", f"Target FID {target:.2f} ({recipe} at NFE {nfe}, its last point): first point at or below it, "
                      f"cost = training + sampling {num} images",
                  "| recipe | NFE | step | train s | sample s | total s | s per 1,000 more images | cheaper beyond |",
                  "|:--|--:|--:|--:|--:|--:|--:|--:|"]
        hits = {key: first_at(c, target) for key, c in curves.items()}
        for (other, other_nfe), hit in hits.items():
            if hit is None:
                lines.append(f"| {other} | {other_nfe} | not reached | | | | | |")
                continue
            lines.append(f"| {other} | {other_nfe} | {hit['step']} | {hit['train_s']:.0f} | {hit['sample_s']:.2f} | "
                         f"{hit['train_s'] + hit['sample_s']:.0f} | {hit['sample_s'] * 1000 / num:.2f} | "
                         f"{break_even(hit, hits, num)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--num", type=int, default=1000)
    ap.add_argument("--flow-steps", type=int, default=None, help="the SiT demo's training steps (default: its own)")
    ap.add_argument("--meanflow-steps", type=int, default=None, help="the MeanFlow demo's (default: its own)")
    ap.add_argument("--flow-sampler-steps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch

    from dit_trainer.demo import demo_steps

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    out = Path(args.out)
    plans = [("SiT (flow matching)", "transport", demo_steps("transport", args.flow_steps), [args.flow_sampler_steps]),
             ("MeanFlow", "meanflow", demo_steps("meanflow", args.meanflow_steps), [1, 2])]
    for name, objective, steps, _ in plans:
        logged = train_run(out / objective, objective, steps, args.seed, args.every, args.num)
        print(f"# {name}: {steps} steps, {logged:.3f} s/step in its run (median of the logged windows)", flush=True)
    speed = probe(out, plans, args.seed)
    print("# probed, alternating step by step: " + ", ".join(f"{name} {speed[objective]:.3f} s/step"
                                                             for name, objective, _, _ in plans), flush=True)
    points = []
    for name, objective, steps, sampler_steps in plans:
        for step in sorted({*range(args.every, steps + 1, args.every), steps}):  # the last step too
            for k in sampler_steps:
                row = score(out / objective, step, k, args.num, device)
                points.append({"recipe": name, "step": step, "train_s": step * speed[objective], **row})
                print(json.dumps(points[-1]), flush=True)
    with open(out / "points.jsonl", "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in points)
    print(f"# seed {args.seed}, {args.num} samples per point, {args.threads} threads")
    print(report(points, args.num))
    return 0


if __name__ == "__main__":
    sys.exit(main())
