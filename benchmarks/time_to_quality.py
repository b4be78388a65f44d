"""Time to quality on the digits: FID against training time for each acceleration and the useful combinations.

    python benchmarks/time_to_quality.py [--task digits16|latent256] [--recipes dit sit dit+routing ...]
        [--seeds 0 1] [--steps N] [--points 4] [--num-samples 1000] [--cfg-scale 1.5] [--nfe 50]
        [--ode-method midpoint] [--out outputs/time_to_quality] [--probe-only]

Every recipe is the demo's config (`dit demo`) with a few keys changed (time_to_quality_recipes.py names
each by what it is). Tasks: `digits16`, the demo itself (DiT-S/4-shaped, 16x16 digits in pixel space: 16
tokens, 4 blocks); `latent256`, the digits at 32x32 with patch 2 (256 tokens, as DiT-XL/2 sees
ImageNet-256 latents) through 8 blocks, where token routing runs at the token count users train with.
Per seed:
1. short probe runs measure each recipe's seconds per step: two rounds, the second in reverse order,
   the median of their logged windows (the first window, warm-up, left out). A probe is never resumed
   or reused run by run: its recipes are timed together in one sitting. A recipe added to an earlier
   measurement is probed again interleaved with the baseline, and its speed is its ratio to the
   baseline in those rounds times the baseline's first probe (time_to_quality_probe.py);
2. the budget is the DiT recipe's time for `--steps` steps; each recipe then trains for as many steps
   as the budget buys it at its probed speed (at least `--steps`), checkpointing every `--save-every`
   steps. A recipe's training seconds at a step are that step times its probed seconds per step, so
   other load on the machine while the long runs go cannot favour one recipe over another (each run's
   own wall time is kept in results.json beside it);
3. the checkpoints nearest to 1/points ... points/points of the budget, and the one at `--steps`
   (equal steps), are sampled with `dit sample-ddp` (`--num-samples`, guidance `--cfg-scale`) and scored
   with `dit eval --network digits` against all 1,797 real digits, drawn at the task's size (the digit
   network sees both at 16x16 through the same resize); a 10x10 grid of each recipe's last samples goes
   beside them, to be looked at.
Every recipe samples with the same number of network evaluations per sample, `--nfe`: DiT by DDIM at
NFE steps, SiT by the ODE's fixed-step `--ode-method` (midpoint: two evaluations per step, so NFE/2
steps; euler: NFE steps). NFE counts the network's evaluations per sample and per guidance branch:
guided sampling evaluates the conditional and null-label halves of a doubled batch in one call, so
every recipe's sampling costs 2 x NFE single-image forwards alike. The tables print it. (The samples'
.npz records both branches, 2 x NFE under guidance; the script checks that count, which also catches
a sampler doing passes the flags did not ask for.)
Prints FID against training seconds and steps, and the speed-up to reach the DiT recipe's FID at the
budget (interpolated between measured points). The second seed runs the recipes in reverse order.
Choose on the first seed, report on the second: the script prints both and selects nothing.
Reuse: a training run is stored in a folder named by a digest of its key (the whole config, the
recipe's overrides, the package's code and torch's version), a score in a file named by its own (the
run's key, the step, samples, guidance, sampler flags, NFE, seed, reference, code), the key beside
each (time_to_quality_keys.py). Run again with the same `--out`: what has the same key is reused, so
an interrupted measurement goes on where it stopped; anything else trains or scores anew.
`--probe-only` probes (or reads the probe), prints each recipe's seconds per step and the training hours
the budget buys it, and stops: what a full measurement will cost.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# benchmarks/ is on sys.path when run as a script.
from _common import table  # noqa: E402
from time_to_quality_keys import check_same, code_version, digest, holds_key, write_key  # noqa: E402
from time_to_quality_probe import median, speeds, still_to_probe  # noqa: E402
from time_to_quality_recipes import (BASELINE, RECIPES, RENAMED, TASKS, objective_of, recipe_overrides,  # noqa: E402
                                     recorded_nfe, sampler_flags, sampler_label, task_config)

SAMPLE_SEED, SAMPLE_BATCH = 0, 250


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    """The code a run or score came from: this checkout's package and torch."""
    import torch

    return {"code": code_version(ROOT / "src" / "dit_trainer"), "torch": torch.__version__}


def dit(args, log: Path) -> None:
    """Run `dit ARGS` with this checkout's code in a fresh process; its output goes to `log`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(log, "a") as f:
        done = subprocess.run([sys.executable, "-m", "dit_trainer", *map(str, args)], stdout=f,
                              stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise SystemExit(f"dit {' '.join(map(str, args[:2]))} failed (exit {done.returncode}); see {log}")


def run_key(recipe: str, task, seed: int, steps: int, save_every: int, log_steps: int) -> dict:
    """Everything that changes a training run of `recipe`."""
    return {"config": task_config(task, seed, steps, save_every, log_steps),
            "overrides": recipe_overrides(recipe, task), **versions()}


def train(parent: Path, recipe: str, task, seed: int, steps: int, save_every: int, log_steps: int,
          fresh: bool = False):
    """Train `recipe` of `task` for `steps` steps in a folder of `parent` named by its key: (folder, the key's
    digest, [(step, seconds per step)] of its logged windows). A finished run of the same key is reused
    unless `fresh` (a probe's timing must come from this sitting)."""
    import yaml

    key = run_key(recipe, task, seed, steps, save_every, log_steps)
    folder = parent / f"{recipe.replace('+', '_')}-{digest(key)}"
    finished = holds_key(folder / "key.json", key) and (folder / "checkpoints" / f"step-{steps:08d}").is_dir()
    if fresh or not finished:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "key.json").unlink(missing_ok=True)  # written again once the run has finished
        config = folder.with_suffix(".yaml")
        config.write_text(yaml.safe_dump({"output_dir": str(folder), **key["config"]}, sort_keys=False))
        overrides = [a for name, value in key["overrides"].items() for a in (f"--{name}", value)]
        dit(["train", "--config", config, "--checkpoint.resume", "false", "--checkpoint.on_existing", "overwrite",
             *overrides], folder.with_suffix(".log"))
        write_key(folder / "key.json", key)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if '"s_per_step"' in line]
    return folder, digest(key), [(r["step"], r["s_per_step"]) for r in rows]


def probe_speeds(base: Path, recipes: list, task, seed: int, steps: int, log_steps: int, rounds: int = 2) -> dict:
    """Each recipe's seconds per step (and its probe group) from interleaved short runs, probing only what no
    earlier probe of this context holds beside the baseline; the groups are kept in a probes-*.json."""
    context = {"config": task_config(task, seed, steps, steps, log_steps), "rounds": rounds, **versions()}
    record_path = base / f"probes-{digest(context)}.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {"context": context, "groups": []}
    check_same(record["context"], context, record_path)
    overrides = {r: recipe_overrides(r, task) for r in recipes}
    todo = still_to_probe(record["groups"], overrides)
    if todo:
        group_dir = base / f"probe-{len(record['groups'])}-{digest([context, {r: overrides[r] for r in todo}])}"
        windows = {r: [] for r in todo}
        for k in range(rounds):
            for recipe in (todo if k % 2 == 0 else todo[::-1]):
                rows = train(group_dir / f"round-{k}", recipe, task, seed, steps, steps, log_steps, fresh=True)[2]
                windows[recipe] += [per for _, per in rows[1:]]
        record["groups"].append({"recipes": {r: overrides[r] for r in todo},
                                 "s_per_step": {r: median(w) for r, w in windows.items()},
                                 "date": time.strftime("%Y-%m-%d %H:%M %Z"), "loadavg": os.getloadavg()})
        base.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record, indent=1) + "\n")
    return speeds(record["groups"], overrides)


def reference(task, out: Path):
    """(`dit eval --ref` argument, its key): the shipped real digits at 16x16, else the real digits drawn at
    the task's size into an ADM .npz under `out`, so real and generated digits meet the same resize."""
    if task.digits_size == 16:
        return "digits", {"ref": "digits"}
    path = out / f"real-digits-{task.digits_size}.npz"
    if not path.is_file():
        import numpy as np

        from dit_trainer.data.digits import load_digit_arrays, upsample_digits

        x = upsample_digits(load_digit_arrays()[0], task.digits_size)
        x = ((x.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).repeat(1, 1, 1, 3).numpy()
        out.mkdir(parents=True, exist_ok=True)
        np.savez(path, arr_0=x)
    import hashlib

    return path, {"ref": "real digits", "size": task.digits_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def score_key(run_digest: str, step: int, flags: list, ref_key: dict, args) -> dict:
    """Everything that changes the FID of a run's checkpoint."""
    return {"run": run_digest, "step": step, "num_samples": args.num_samples, "cfg_scale": args.cfg_scale,
            "sampler": flags, "nfe": args.nfe, "seed": SAMPLE_SEED, "batch_size": SAMPLE_BATCH, "network": "digits",
            "reference": ref_key, **versions()}


def check_recorded_nfe(npz: Path, expected: int) -> None:
    """One line (SystemExit) when the samples record other network evaluations per sample than `expected`
    (a sampler of an older version records none, and passes)."""
    import numpy as np

    with np.load(npz) as z:
        recorded = float(z["nfe"]) if "nfe" in z.files else None
    if recorded is not None and recorded != expected:
        raise SystemExit(f"{npz} records {recorded:g} network evaluations per sample where the flags ask {expected}; "
                         "the sampler did more or less than they say")


def score(folder: Path, run_digest: str, step: int, recipe: str, ref, args) -> tuple:
    """(FID of `--num-samples` samples of `folder`'s checkpoint at `step` at `--nfe` evaluations, the .npz)."""
    flags = sampler_flags(objective_of(recipe), args.nfe, args.ode_method)
    key = score_key(run_digest, step, flags, ref[1], args)
    name = f"{step}-{digest(key)}"
    npz, out = folder / f"samples-{name}.npz", folder / f"fid-{name}.json"
    if holds_key(folder / f"fid-{name}.key.json", key):  # scored by an earlier run of this script
        return float(json.loads(out.read_text())["fid"]), npz
    log = folder.with_suffix(".log")
    dit(["sample-ddp", "--ckpt", folder / "checkpoints" / f"step-{step:08d}", "--npz", npz, "--num-samples",
         args.num_samples, "--batch-size", SAMPLE_BATCH, "--cfg-scale", args.cfg_scale, *flags, "--seed", SAMPLE_SEED,
         "--device", "cpu", "--no-progress"], log)
    check_recorded_nfe(npz, recorded_nfe(args.nfe, args.cfg_scale))
    dit(["eval", "--samples", npz, "--ref", ref[0], "--network", "digits", "--device", "cpu", "--json", out,
         "--no-progress"], log)
    write_key(folder / f"fid-{name}.key.json", key)
    return float(json.loads(out.read_text())["fid"]), npz


def save_grid(npz: Path, png: Path, n: int = 100) -> None:
    """The first `n` samples of an ADM .npz as a 10-wide grid, enlarged to about 64 px a digit, for looking at."""
    import numpy as np
    from PIL import Image

    with np.load(npz) as z:
        images = z["arr_0"][:n]
    rows = [np.concatenate(list(images[i:i + 10]), axis=1) for i in range(0, len(images) - len(images) % 10, 10)]
    grid = np.concatenate(rows, axis=0)
    scale = max(1, 64 // images.shape[1])
    Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale), Image.NEAREST).save(png)


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


def run_seed(seed: int, recipes: list, task, args) -> list:
    """Every recipe on one seed: probe, train to the budget, score; one result dict per recipe."""
    base = Path(args.out) / task.name / f"seed-{seed}"
    probed = probe_speeds(base, recipes, task, seed, args.probe_steps, args.probe_log_steps)
    speed = {r: p["s_per_step"] for r, p in probed.items()}
    budget = speed[BASELINE] * args.steps
    print(f"{task.name} seed {seed}: budget {budget:.0f} s ({args.steps} steps of {BASELINE} at "
          f"{speed[BASELINE]:.3f} s/step)", flush=True)
    ref = reference(task, Path(args.out))
    results = []
    for recipe in recipes:
        fit = args.save_every * round(budget / speed[recipe] / args.save_every)
        steps = max(args.steps, fit)
        t0 = time.perf_counter()
        folder, run_digest, _ = train(base, recipe, task, seed, steps, args.save_every, log_steps=args.save_every)
        saved = list(range(args.save_every, steps + 1, args.save_every))
        want = {min(saved, key=lambda s: abs(s * speed[recipe] - budget * k / args.points))
                for k in range(1, args.points + 1)}
        want.add(args.steps)
        curve, npz = [], None
        for step in sorted(want):
            fid, npz = score(folder, run_digest, step, recipe, ref, args)
            curve.append((step, step * speed[recipe], fid))
        if npz.is_file():
            save_grid(npz, folder / "samples.png")
        flags = sampler_flags(objective_of(recipe), args.nfe, args.ode_method)
        results.append({"task": task.name, "seed": seed, "recipe": recipe, "s_per_step": speed[recipe],
                        "probe": probed[recipe], "budget_s": budget, "nfe": args.nfe, "sampler": sampler_label(flags),
                        "run": str(folder), "curve": curve, "wall_s": time.perf_counter() - t0})
        line = "  ".join(f"step {s} {t:.0f}s FID {f:.2f}" for s, t, f in curve)
        print(f"{task.name} seed {seed} {recipe}: {line}", flush=True)
    return results


def report(results: list, steps: int) -> str:
    """One markdown table per seed: FID at the budget and at equal steps beside the sampler's NFE, and the time
    to the baseline's FID."""
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
            body.append([r["recipe"], f"{r['s_per_step']:.3f}", f"{at_budget[0]}", r["sampler"], f"{r['nfe']}",
                         f"{at_budget[2]:.2f}", f"{at_steps[2]:.2f}", "-" if reach is None else f"{reach:.0f}",
                         "-" if reach is None else f"{r['budget_s'] / reach:.2f}x"])
        out.append(f"seed {seed}: target = {BASELINE}'s FID at the budget ({target:.2f}, {base['budget_s']:.0f} s); "
                   "NFE: network evaluations per sample per guidance branch\n"
                   + table(["recipe", "s/step", "steps in budget", "sampler", "NFE", "FID at budget",
                            f"FID at {steps} steps", "s to target", "speed-up"], body))
    return "\n\n".join(out)


def probe_report(probed: dict, args) -> str:
    """The probe as a table: each recipe's seconds per step, its ratio to the baseline's, and the steps and
    training hours the budget of `--steps` baseline steps buys it."""
    budget = probed[BASELINE]["s_per_step"] * args.steps
    body = []
    for recipe, p in probed.items():
        steps = max(args.steps, args.save_every * round(budget / p["s_per_step"] / args.save_every))
        body.append([recipe, f"{p['s_per_step']:.3f}", f"{p['s_per_step'] / probed[BASELINE]['s_per_step']:.2f}",
                     f"{p['group']}", f"{steps}", f"{steps * p['s_per_step'] / 3600:.2f}"])
    return table(["recipe", "s/step", f"vs {BASELINE}", "probe group", "steps in budget", "training h"], body)


def parse_args(argv=None):
    """The flags, with the task's defaults filled in; one-line errors for what cannot run."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=list(TASKS), default="digits16",
                   help="; ".join(f"{t.name}: {t.about}" for t in TASKS.values()))
    p.add_argument("--recipes", nargs="+", default=None, help=f"of {', '.join(RECIPES)} (default: the task's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="the first to choose on, the rest to report")
    p.add_argument("--steps", type=int, default=None,
                   help="the DiT recipe's steps: the budget and the equal-steps point (default: the task's)")
    p.add_argument("--save-every", type=int, default=None, help="default: the task's")
    p.add_argument("--points", type=int, default=4, help="measured points along the budget")
    p.add_argument("--probe-steps", type=int, default=None, help="default: the task's")
    p.add_argument("--probe-log-steps", type=int, default=None,
                   help="steps per timed window of the probe, the first left out (default: the task's)")
    p.add_argument("--num-samples", type=int, default=1000)
    p.add_argument("--cfg-scale", type=float, default=1.5)
    p.add_argument("--nfe", type=int, default=50, help="network evaluations per sample, every recipe alike")
    p.add_argument("--ode-method", default="midpoint", help="SiT's fixed-step ODE method (euler, midpoint, heun3, rk4)")
    p.add_argument("--out", default="outputs/time_to_quality")
    p.add_argument("--probe-only", action="store_true",
                   help="probe, print each recipe's seconds per step and the training the budget buys, and stop")
    args = p.parse_args(argv)
    task = TASKS[args.task]
    for name, value in (("recipes", list(task.recipes)), ("steps", task.steps), ("save_every", task.save_every),
                        ("probe_steps", task.probe_steps), ("probe_log_steps", task.probe_log_steps)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    for recipe in args.recipes:
        if recipe in RENAMED:
            p.error(f"recipe {recipe} is now called {RENAMED[recipe]}")
        if recipe not in RECIPES:
            p.error(f"unknown recipe {recipe}; choose from {', '.join(RECIPES)}")
    if args.steps % args.save_every:
        p.error(f"--steps {args.steps} must be a multiple of --save-every {args.save_every}")
    if args.probe_steps < 3 * args.probe_log_steps:
        p.error(f"--probe-steps {args.probe_steps} leaves under two timed windows of {args.probe_log_steps} steps")
    try:
        for objective in ("diffusion", "transport"):
            sampler_flags(objective, args.nfe, args.ode_method)
    except ValueError as e:
        p.error(str(e))
    return args, task


def main(argv=None) -> int:
    """Parse the flags, run every seed, print and save the tables."""
    args, task = parse_args(argv)
    recipes = [BASELINE] + [r for r in args.recipes if r != BASELINE]
    import torch

    from _common import machine

    print(machine(torch.device("cpu")), flush=True)
    print(f"task {task.name}: {task.about}", flush=True)
    if args.probe_only:
        for seed in args.seeds:
            base = Path(args.out) / task.name / f"seed-{seed}"
            print(probe_report(probe_speeds(base, recipes, task, seed, args.probe_steps, args.probe_log_steps), args))
        return 0
    results = []
    for i, seed in enumerate(args.seeds):
        results += run_seed(seed, recipes if i % 2 == 0 else [recipes[0], *reversed(recipes[1:])], task, args)
    out = Path(args.out) / task.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(report(results, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
