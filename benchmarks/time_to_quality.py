"""Time to quality on the digits: FID against training time for each acceleration and the useful combinations.

    python benchmarks/time_to_quality.py [--recipes dit sit dit+routing ...] [--seeds 0 1] [--steps 1400]
        [--points 4] [--num-samples 1000] [--cfg-scale 1.5] [--sample-steps 25] [--out outputs/time_to_quality]

Every recipe is the demo's config (`dit demo`: DiT-S/4-shaped, 16x16 digits, pixel space) with a few
keys changed. Per seed:
1. short probe runs of each recipe measure its seconds per step: two rounds, the second in reverse order,
   the median of their logged windows (the first window, warm-up, left out);
2. the budget is the DiT recipe's time for `--steps` steps (the demo's training time); each recipe
   then trains for as many steps as the budget buys it at its probed speed (at least `--steps`),
   checkpointing every `--save-every` steps. A recipe's training seconds at a step are that step times
   its probed seconds per step, so other load on the machine while the long runs go cannot favour one
   recipe over another (each run's own wall time is kept in results.json beside it);
3. the checkpoints nearest to 1/points ... points/points of the budget, and the one at `--steps`
   (equal steps), are sampled with `dit sample-ddp` (`--num-samples`, guidance `--cfg-scale`, the
   objective's default sampler) and scored with `dit eval --network digits --ref digits` (all 1,797
   real digits); a 10x10 grid of each recipe's last samples goes beside them, to be looked at.
Prints FID against training seconds and steps, and the speed-up to reach the DiT recipe's FID at the
budget (interpolated between measured points). The second seed runs the recipes in reverse order.
Choose on the first seed, report on the second: the script prints both and selects nothing.
Run again with the same `--out`, it reuses every finished training run and score (a checkpoint at a
run's last step, a written FID), so an interrupted measurement goes on where it stopped.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _common import table  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

# The demo's 4 blocks: route the middle two (TREAD keeps the first and last blocks full).
ROUTING = {"train.routing_keep": 0.5, "train.routing_start": 1, "train.routing_end": 3}
LIGHTNING = {"model.norm": "rmsnorm", "model.mlp": "swiglu", "model.rope": True, "model.qk_norm": True}
SIT = {"objective": "transport"}

RECIPES = {
    "dit": {},
    "sit": SIT,
    "dit+logit-normal": {"diffusion.timestep_sampler": "logit-normal"},
    "dit+min-snr": {"diffusion.loss_weighting": "min-snr"},
    "dit+routing": ROUTING,
    "dit+lightning": LIGHTNING,
    "sit+logit-normal": {**SIT, "transport.t_sampler": "logit-normal"},
    "sit+direction": {**SIT, "transport.direction_loss_weight": 1.0},
    "sit+routing": {**SIT, **ROUTING},
    "dit+all": {"diffusion.timestep_sampler": "logit-normal", "diffusion.loss_weighting": "min-snr",
                **ROUTING, **LIGHTNING},
    "sit+all": {**SIT, "transport.t_sampler": "logit-normal", "transport.direction_loss_weight": 1.0,
                **ROUTING, **LIGHTNING},
    # Not an acceleration: the demo keeps no EMA (its samples are recognised best without one), and the
    # raw weights' FID swings from checkpoint to checkpoint; an EMA of about the last 100 steps shows
    # what that choice costs.
    "sit+ema": {**SIT, "train.ema_decay": 0.99},
}
BASELINE = "dit"


def dit(args, log: Path) -> None:
    """Run `dit ARGS` with this checkout's code in a fresh process; its output goes to `log`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(log, "a") as f:
        done = subprocess.run([sys.executable, "-m", "dit_trainer", *map(str, args)], stdout=f,
                              stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise SystemExit(f"dit {' '.join(map(str, args[:2]))} failed (exit {done.returncode}); see {log}")


def write_config(folder: Path, seed: int, steps: int, save_every: int, log_steps: int) -> Path:
    """The demo's config as DiT (the baseline; a recipe's overrides make it SiT) for `steps` steps and
    `seed`, saving every `save_every` steps, as YAML."""
    import yaml

    from dit_trainer.demo import demo_config

    raw = demo_config(folder, steps=steps, seed=seed, objective="diffusion", fid_samples=0)
    raw["checkpoint"].update(save_steps=save_every, save_total_limit=0)
    raw["logging"].update(log_steps=log_steps, progress=False)
    path = folder.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def train(folder: Path, recipe: str, seed: int, steps: int, save_every: int, log_steps: int) -> list:
    """Train `recipe` for `steps` steps in `folder`; [(step, seconds per step)] of its logged windows."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    config = write_config(folder, seed, steps, save_every, log_steps)
    overrides = [a for key, value in RECIPES[recipe].items() for a in (f"--{key}", value)]
    finished = (folder / "checkpoints" / f"step-{steps:08d}").is_dir() and (folder / "metrics.jsonl").is_file()
    if not finished:  # checkpoints are renamed into place whole: one there is a finished run
        dit(["train", "--config", config, "--checkpoint.resume", "false", "--checkpoint.on_existing", "overwrite", *overrides], folder.with_suffix(".log"))
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if '"s_per_step"' in line]
    return [(r["step"], r["s_per_step"]) for r in rows]


def probe_speeds(base: Path, recipes: list, seed: int, steps: int, rounds: int = 2) -> dict:
    """Median seconds per step of each recipe over `rounds` interleaved short runs, warm-up windows left out."""
    windows = {r: [] for r in recipes}
    for k in range(rounds):
        for recipe in (recipes if k % 2 == 0 else recipes[::-1]):
            windows[recipe] += [per for _, per in train(base / f"round-{k}" / recipe.replace("+", "_"), recipe, seed,
                                                          steps, steps, log_steps=10)[1:]]
    return {r: sorted(w)[len(w) // 2] for r, w in windows.items()}


def score(folder: Path, step: int, args) -> float:
    """FID (digit network, all real digits) of `--num-samples` samples of `folder`'s checkpoint at `step`."""
    ckpt = folder / "checkpoints" / f"step-{step:08d}"
    npz, out = folder / f"samples-{step}.npz", folder / f"fid-{step}.json"
    if out.is_file():  # scored by an earlier run of this script
        return float(json.loads(out.read_text())["fid"])
    log = folder.with_suffix(".log")
    dit(["sample-ddp", "--ckpt", ckpt, "--npz", npz, "--num-samples", args.num_samples, "--batch-size", 250,
         "--cfg-scale", args.cfg_scale, "--steps", args.sample_steps, "--seed", 0, "--device", "cpu",
         "--no-progress"], log)
    dit(["eval", "--samples", npz, "--ref", "digits", "--network", "digits", "--device", "cpu", "--json", out,
         "--no-progress"], log)
    return float(json.loads(out.read_text())["fid"])


def save_grid(npz: Path, png: Path, n: int = 100) -> None:
    """The first `n` samples of an ADM .npz as a 10-wide grid, enlarged 4x, for looking at."""
    import numpy as np
    from PIL import Image

    with np.load(npz) as z:
        images = z["arr_0"][:n]
    rows = [np.concatenate(list(images[i:i + 10]), axis=1) for i in range(0, len(images) - len(images) % 10, 10)]
    grid = np.concatenate(rows, axis=0)
    Image.fromarray(grid).resize((grid.shape[1] * 4, grid.shape[0] * 4), Image.NEAREST).save(png)


def time_to_reach(points: list, target: float):
    """Seconds at which FID first falls to `target`, linear between measured (seconds, FID) points; None: never."""
    previous = None
    for seconds, fid in sorted(points):
        if fid <= target:
            if previous is None or previous[1] <= fid:
                return seconds
            s0, f0 = previous
            return s0 + (seconds - s0) * (f0 - target) / (f0 - fid)
        previous = (seconds, fid)
    return None


def run_seed(seed: int, recipes: list, args) -> list:
    """Every recipe on one seed: probe, train to the budget, score; one result dict per recipe."""
    base = Path(args.out) / f"seed-{seed}"
    speed = probe_speeds(base / "probe", recipes, seed, args.probe_steps)
    budget = speed[BASELINE] * args.steps
    print(f"seed {seed}: budget {budget:.0f} s ({args.steps} steps of {BASELINE} at {speed[BASELINE]:.3f} s/step)",
          flush=True)
    results = []
    for recipe in recipes:
        folder = base / recipe.replace("+", "_")
        fit = args.save_every * round(budget / speed[recipe] / args.save_every)
        steps = max(args.steps, fit)
        t0 = time.perf_counter()
        train(folder, recipe, seed, steps, args.save_every, log_steps=args.save_every)
        saved = list(range(args.save_every, steps + 1, args.save_every))
        want = {min(saved, key=lambda s: abs(s * speed[recipe] - budget * k / args.points))
                for k in range(1, args.points + 1)}
        want.add(args.steps)
        curve = [(step, step * speed[recipe], score(folder, step, args)) for step in sorted(want)]
        save_grid(folder / f"samples-{max(want)}.npz", folder / "samples.png")
        results.append({"seed": seed, "recipe": recipe, "s_per_step": speed[recipe], "budget_s": budget,
                        "curve": curve, "wall_s": time.perf_counter() - t0})
        line = "  ".join(f"step {s} {t:.0f}s FID {f:.2f}" for s, t, f in curve)
        print(f"seed {seed} {recipe}: {line}", flush=True)
    return results


def report(results: list, steps: int) -> str:
    """One markdown table per seed: FID at the budget and at equal steps, and the time to the baseline's FID."""
    out = []
    for seed in sorted({r["seed"] for r in results}):
        rows = [r for r in results if r["seed"] == seed]
        base = next(r for r in rows if r["recipe"] == BASELINE)
        target = base["curve"][-1][2]
        body = []
        for r in rows:
            at_budget = min(r["curve"], key=lambda p: abs(p[1] - r["budget_s"]))
            at_steps = next(p for p in r["curve"] if p[0] == steps)
            reach = time_to_reach([(t, f) for _, t, f in r["curve"]], target)
            body.append([r["recipe"], f"{r['s_per_step']:.3f}", f"{at_budget[0]}", f"{at_budget[2]:.2f}",
                         f"{at_steps[2]:.2f}", "-" if reach is None else f"{reach:.0f}",
                         "-" if reach is None else f"{r['budget_s'] / reach:.2f}x"])
        out.append(f"seed {seed}: target = {BASELINE}'s FID at the budget ({target:.2f}, {base['budget_s']:.0f} s)\n"
                   + table(["recipe", "s/step", "steps in budget", "FID at budget", f"FID at {steps} steps",
                            "s to target", "speed-up"], body))
    return "\n\n".join(out)


def main(argv=None) -> int:
    """Parse the flags, run every seed, print and save the tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="the first to choose on, the rest to report")
    p.add_argument("--steps", type=int, default=1400, help="the DiT recipe's steps: the budget and the equal-steps point")
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--points", type=int, default=4, help="measured points along the budget")
    p.add_argument("--probe-steps", type=int, default=60)
    p.add_argument("--num-samples", type=int, default=1000)
    p.add_argument("--cfg-scale", type=float, default=1.5)
    p.add_argument("--sample-steps", type=int, default=25)
    p.add_argument("--out", default="outputs/time_to_quality")
    args = p.parse_args(argv)
    if args.steps % args.save_every:
        p.error(f"--steps {args.steps} must be a multiple of --save-every {args.save_every}")
    recipes = [BASELINE] + [r for r in args.recipes if r != BASELINE]
    import torch

    from _common import machine

    print(machine(torch.device("cpu")), flush=True)
    results = []
    for i, seed in enumerate(args.seeds):
        results += run_seed(seed, recipes if i % 2 == 0 else [recipes[0], *reversed(recipes[1:])], args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(report(results, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
