"""How long `dit demo --text` takes beside `dit demo`, measured side by side in one process.

    python benchmarks/demo_text_speed.py [--rounds 6] [--steps 10] [--samples 1797]

On a shared machine wall times say little, but ratios taken in one process, interleaved, do. This
builds both demos' trainers (their own configs, the same global batch of 64) and times `--steps`
training steps of each in turn for `--rounds` rounds (the median round of each counts), then times
the text demo's end: drawing `--samples` prompts as the run recommends (a run of 2 steps stands in
for the trained one: sampling costs the same) and scoring them. It prints each per-step time, their
ratio, and the text demo's budget: the steps that fit in 240 s on an idle machine where the class
demo's step takes `--class-step` seconds (0.15: its 1,200 steps in 180 s), after the end's cost,
counted in class-demo steps so that it too carries over from this machine's load to an idle one.
"""

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def trainer_and_batch(config: dict):
    """A trainer of `config` and one global batch of its data (as its loader collates it)."""
    from torch.utils.data import DataLoader

    from dit_trainer.train import DiTTrainer

    trainer = DiTTrainer(config)
    batch = next(iter(DataLoader(trainer.dataset, batch_size=trainer.cfg.train.global_batch_size, shuffle=True)))
    return trainer, batch


def time_steps(trainer, batch, n: int) -> float:
    """Seconds per step of `n` steps on `batch`, run as train() runs them."""
    t0 = time.perf_counter()
    for _ in range(n):
        trainer.queue_step(batch)
    trainer.update.read_losses()
    return (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=10, help="steps per demo per round")
    p.add_argument("--samples", type=int, default=1797, help="prompts drawn at the text demo's end")
    p.add_argument("--class-step", type=float, default=0.15, help="the class demo's idle seconds per step")
    p.add_argument("--budget", type=float, default=240.0, help="the text demo's idle seconds, end to end")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the demo uses what torch picks: 2 here)")
    p.add_argument("--steps-only", action="store_true", help="time the training steps only, not the end")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from dit_trainer.demo import demo_config
    from dit_trainer.demo_text import DEMO_TEXT_STEPS, demo_text_config, run_demo_text, write_text_encoder

    print(f"# demo_text_speed  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"# {machine(torch.device('cpu'))}")
    with tempfile.TemporaryDirectory() as tmp:
        class_out, text_out = Path(tmp) / "class", Path(tmp) / "text"
        write_text_encoder(text_out)
        runs = {"class": trainer_and_batch(demo_config(class_out)),
                "text": trainer_and_batch(demo_text_config(text_out.resolve()))}
        for trainer, batch in runs.values():
            time_steps(trainer, batch, 3)  # warm-up: first-call allocations
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, (trainer, batch) in runs.items():
                times[name].append(time_steps(trainer, batch, args.steps))
        step = {name: statistics.median(t) for name, t in times.items()}
        ratio = step["text"] / step["class"]
        print(f"class demo step {step['class']:.3f} s, text demo step {step['text']:.3f} s (medians of "
              f"{args.rounds} rounds of {args.steps}): ratio {ratio:.3f}; per round: "
              + ", ".join(f"{t / c:.2f}" for c, t in zip(times["class"], times["text"])), flush=True)
        if args.steps_only:
            return 0
        # The end: a 2-step run sampled and scored as the demo does, timed against class steps taken right after.
        t0 = time.perf_counter()
        summary = run_demo_text(Path(tmp) / "end", steps=2, per_row=8, progress=False, fid_samples=args.samples)
        end_s = time.perf_counter() - t0 - summary["train_seconds"]
        after = time_steps(*runs["class"], args.steps)
    end_in_steps = end_s / statistics.mean([step["class"], after])
    idle_end = end_in_steps * args.class_step
    fit = int((args.budget - idle_end) / (args.class_step * ratio))
    print(f"text demo's end ({args.samples} prompts sampled and scored, the grid, FID): {end_s:.1f} s here = "
          f"{end_in_steps:.0f} class-demo steps (sampling alone {summary['sample_seconds']:.1f} s)")
    print(f"idle budget at {args.class_step} s per class step: end {idle_end:.0f} s, {args.class_step * ratio:.3f} s "
          f"per text step, so {fit} steps fit in {args.budget:.0f} s")
    print(f"the demo's {DEMO_TEXT_STEPS} steps: {idle_end + DEMO_TEXT_STEPS * args.class_step * ratio:.0f} s idle, "
          f"end to end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
