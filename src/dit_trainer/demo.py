"""`dit demo`: a class-conditional DiT learns scikit-learn's bundled digits on a CPU in minutes.

No download: the 1,797 8×8 digits ship with scikit-learn. They are upsampled to 16×16, trained
on in pixel space (one channel, no VAE), and sampled with classifier-free guidance into a grid,
one row per digit. The network trains as SiT (interpolant transport) unless `--objective diffusion`
asks for DiT's Gaussian diffusion. The config is `configs/demo_digits.yaml`; `demo_config()` is its
source.
"""

import time
from pathlib import Path

from dit_trainer.errors import ConfigError
from dit_trainer.plot import plot_loss  # noqa: F401 (tests and users found it here)

# SiT by default: on the digits it reached the DiT recipe's 3-minute FID in under a third of the
# training time (benchmarks/time_to_quality.py, chosen on seed 0; benchmarks/RESULTS.md).
DEMO_OBJECTIVE = "transport"
# Steps per objective. DiT: 1,400, 100% recognised with seeds 0 and 1 (as at 1,600). SiT: 1,200,
# because its ODE samples twice per step (midpoint) and so its FID step costs twice DiT's; that
# keeps the whole command within 3 minutes on two cores.
DEMO_STEPS = {"diffusion": 1400, "transport": 1200}
# FID at the end against all 1,797 real digits: 500 unguided samples cost ~10 s on two cores as
# DiT (~20 s as SiT), which `dit demo`'s 3 minutes can take; 500 real digits score ~3 against the
# same statistics (benchmarks/RESULTS.md).
DEMO_FID_SAMPLES = 500


def demo_steps(objective=DEMO_OBJECTIVE, steps=None) -> int:
    """`steps`, or the demo's own length for `objective`; ConfigError for an objective it lacks."""
    if objective not in DEMO_STEPS:
        raise ConfigError(f"demo objective {objective!r} is not one of {sorted(DEMO_STEPS)}")
    return DEMO_STEPS[objective] if steps is None else steps


def demo_config(out="outputs/demo", steps=None, seed=0, objective=DEMO_OBJECTIVE,
                fid_samples=DEMO_FID_SAMPLES) -> dict:
    """The demo's config: a small DiT-S/4-shaped model sized for two CPU cores.

    Tuned so that the whole `dit demo` stays under 3 minutes on two cores with >= 97% of the
    samples recognised (`python scripts/demo/demo_check.py` measures both). `objective="transport"`
    (SiT): a linear interpolant with velocity prediction, sampled by the probability-flow ODE;
    `"diffusion"` (DiT): Gaussian diffusion sampled by DDIM. `steps=None`: the objective's own.
    """
    steps = demo_steps(objective, steps)
    return {
        "output_dir": str(out),
        "objective": objective,
        # A fixed-step 2nd-order ODE solver: logging.sample_steps (25) midpoint steps for 16x16 digits.
        "transport": {"path_type": "Linear", "prediction": "velocity", "ode_method": "midpoint"},
        "model": {"name": "DiT-S/4", "input_size": 16, "in_channels": 1, "num_classes": 10,
                  "depth": 4, "hidden_size": 192, "num_heads": 4, "learn_sigma": False, "class_dropout_prob": 0.1},
        # Cosine: the linear schedule drowns 8x8-detail digits in noise early; cosine gave clearly
        # better class fidelity at the same cost (0.81 vs 0.78 recognised at 1500 steps).
        "diffusion": {"num_timesteps": 1000, "noise_schedule": "cosine"},
        "data": {"path": "digits", "digits_size": 16, "num_workers": 0, "random_flip": False},
        # 2e-3 rather than 1e-3: at 1,750 steps (guidance 12, no EMA) 100% recognised instead of 98%.
        "optim": {"lr": 2e-3, "warmup_steps": 100, "max_grad_norm": 1.0},
        # fp32: bf16 autocast is no faster at width 192 on the 2-core CPU (0.116 vs 0.118 s/step).
        # No EMA (decay 0: the EMA is the raw weights): the model still improves fast at the end of
        # so short a run, and averaging lags it (1,750 steps, guidance 12: 95% with decay 0.99,
        # 98% without; 1,600 steps: 88% with 0.995, 96% without).
        "train": {"max_steps": int(steps), "global_batch_size": 64, "seed": int(seed), "mixed_precision": "fp32",
                  "ema_decay": 0.0, "ema_warmup": True},
        "checkpoint": {"save_steps": 1000, "save_total_limit": 1},
        # 25 DDIM steps scored as 50 and 100 did, in half the sampling time. Guidance 4: on this
        # config's model 4, 6, 8 and 12 all gave 100%, and 4 keeps the most variety within a row.
        "logging": {"log_steps": 50, "image_steps": 0, "tensorboard": False, "sample_steps": 25,
                    "sample_cfg_scale": 4.0, "samples_per_class": 10},
        # FID against the real digits (the digit network) once, at the last step; 0 samples: none.
        "eval": {"every": int(steps) if fid_samples else 0, "num_samples": int(fid_samples or DEMO_FID_SAMPLES),
                 "sample_batch_size": 250,
                 "sample_steps": 25, "cfg_scale": 1.0},
    }


def run_demo(out="outputs/demo", steps=None, seed=0, per_class=10, progress=True,
             objective=DEMO_OBJECTIVE, fid_samples=DEMO_FID_SAMPLES) -> dict:
    """Train (FID at the end), then write samples.png, samples.npz (ADM format) and loss.png into `out`; returns a summary
    (only `stopped`, `steps` and `train_seconds` when a signal stopped the training)."""
    import numpy as np
    import torch

    from dit_trainer.config import build_config
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.sample import sample_latents, save_grid, save_npz
    from dit_trainer.train import DiTTrainer

    out = Path(out)
    cfg = build_config(demo_config(out, steps, seed, objective, fid_samples))
    cfg.logging.progress = progress
    trainer = DiTTrainer(cfg)
    keep_freed_memory_on(trainer.device)  # the demo is a whole command's run: the process-wide setting is its own
    t0 = time.perf_counter()
    metrics = trainer.train(max_steps_name="--steps")
    train_s = time.perf_counter() - t0
    if trainer.stop_requested:
        # SIGTERM/Ctrl-C: the checkpoint is saved; sampling a half-trained model is not what was asked.
        return {"stopped": True, "steps": trainer.step, "train_seconds": train_s}
    # A finished run in `out` is resumed and sampled again without a step, and logs nothing.
    already_finished = not metrics and trainer.step >= cfg.train.max_steps

    labels = [c for c in range(10) for _ in range(per_class)]
    with torch.autocast(trainer.device.type, dtype=trainer.amp_dtype, enabled=trainer.amp_dtype is not None):
        # The objective's default sampler: DDIM for diffusion, the ODE for transport.
        images = sample_latents(trainer.ema_model(), trainer.objective, labels, cfg_scale=cfg.logging.sample_cfg_scale,
                                steps=cfg.logging.sample_steps, seed=seed, device=trainer.device, progress=progress)
    images = images.float().clamp(-1, 1).cpu()
    grid = save_grid(images, out / "samples.png", nrow=per_class)
    # 16-pixel digits are too small to judge on screen: enlarge 4x without smoothing.
    from PIL import Image

    with Image.open(grid) as im:
        im.resize((im.width * 4, im.height * 4), Image.NEAREST).save(grid)
    # The ADM format of every samples .npz (uint8 N×H×W×3 `arr_0`, labels `arr_1`): `dit eval` reads it as is.
    save_npz(out / "samples.npz", images, np.asarray(labels, dtype=np.int64))
    family = "SiT" if objective == "transport" else "DiT"
    loss_png = plot_loss(out / "metrics.jsonl", out / "loss.png", title=f"dit demo: {family} on scikit-learn digits")
    summary = {"samples": str(grid), "loss_plot": str(loss_png), "train_seconds": train_s, "steps": trainer.step,
               "already_finished": already_finished}
    from dit_trainer.train.metrics import read_metrics

    # From the file, so a finished run sampled again still reports the FID it logged.
    fids = [r for r in read_metrics(out / "metrics.jsonl") if r.get("fid") is not None]
    if fids:
        summary.update(fid=fids[-1]["fid"], fid_step=fids[-1]["step"], fid_samples=cfg.eval.num_samples)
    try:
        from dit_trainer.data.digits import classify_images

        pred = classify_images(images.numpy())
        summary["recognised"] = float((pred == np.asarray(labels)).mean())
    except Exception:  # the check is a courtesy; a missing scikit-learn must not fail the demo
        pass
    return summary


def add_commands(sub) -> None:
    """Register `dit demo`."""
    p = sub.add_parser("demo", help="train a small DiT-shaped SiT on scikit-learn's digits and draw a sample grid "
                                    "(CPU, minutes)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps (default: {DEMO_STEPS['transport']} as SiT, {DEMO_STEPS['diffusion']} as DiT)")
    p.add_argument("--out", default="outputs/demo", help="output folder")
    p.add_argument("--seed", type=int, default=0, help="seed of data order, noise and weights")
    p.add_argument("--per-class", type=int, default=10, help="samples per digit in the grid")
    p.add_argument("--fid-samples", type=int, default=DEMO_FID_SAMPLES,
                   help="samples for the FID against the real digits at the end (digit network); 0: none")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--objective", choices=("diffusion", "transport"), default=DEMO_OBJECTIVE,
                   help="interpolant transport (SiT, the default) or Gaussian diffusion (DiT)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the demo and say where its pictures are."""
    if args.fid_samples != 0 and args.fid_samples < 2:
        raise ConfigError(f"--fid-samples is {args.fid_samples}; FID needs at least 2 samples (0: no FID)")
    steps = demo_steps(args.objective, args.steps)
    summary = run_demo(args.out, steps, args.seed, args.per_class, progress=not args.no_progress,
                       objective=args.objective, fid_samples=args.fid_samples)
    if summary.get("stopped"):
        print(f"stopped at step {summary['steps']} of {steps}; the checkpoint is in {args.out}/checkpoints: rerun "
              f"the same dit demo command to continue")
        return 0
    if summary["already_finished"]:
        print(f"{args.out} holds a finished run of {summary['steps']} steps: no training, sampled it again")
    else:
        print(f"trained {summary['steps']} steps in {summary['train_seconds']:.0f} s")
    if "recognised" in summary:
        print(f"a digit classifier trained on the real digits recognises {summary['recognised']:.0%} of the samples")
    if "fid" in summary:
        print(f"FID against the real digits (digit network, {summary['fid_samples']} unguided samples at step "
              f"{summary['fid_step']}): {summary['fid']:.2f}")
    print(f"samples: {summary['samples']}\nloss curve: {summary['loss_plot']}")
    return 0
