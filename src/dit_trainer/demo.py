"""`dit demo`: a class-conditional DiT learns scikit-learn's bundled digits on a CPU in minutes.

No download: the 1,797 8×8 digits ship with scikit-learn. They are upsampled to 16×16 and trained
on in pixel space (one channel, no VAE) with post-hoc EMA profiles tracked. At the end the EMA is
rebuilt and 1,000 samples are drawn as the run recommends (its `sample:` section: autoguidance by the
run's own halfway EMA, a little classifier-free guidance, both in a guidance interval), scored against
the real digits and shown as a grid, one row per digit. The network trains as SiT (interpolant
transport) unless `--objective diffusion` asks for DiT's Gaussian diffusion. The config is
`configs/demo_digits.yaml`; `demo_config()` is its source.
"""

import json
import time
from pathlib import Path

from dit_trainer.errors import ConfigError
from dit_trainer.meanflow import demo as meanflow_demo
from dit_trainer.plot import plot_loss  # noqa: F401 (tests and users found it here)

# SiT by default: on the digits it reached the DiT recipe's 3-minute FID in under a third of the
# training time (benchmarks/time_to_quality.py, chosen on seed 0; benchmarks/RESULTS.md).
DEMO_OBJECTIVE = "transport"
# Steps per objective. DiT: 1,400, 100% recognised with seeds 0 and 1 (as at 1,600). SiT: 1,200, which
# leaves the end's 1,000 guided samples room within 3 minutes on two cores.
DEMO_STEPS = {"diffusion": 1400, "transport": 1200, "meanflow": meanflow_demo.STEPS}
# The samples at the end: FID against all 1,797 real digits (digit network), the share a digit classifier
# recognises, and the grid, all from one batch drawn as the run recommends (the `sample:` section).
DEMO_FID_SAMPLES = 1000
# Post-hoc EMA: the two widths EDM2 tracks. The main model samples with the 0.05 profile at the last step,
# the autoguidance guide with the 0.10 profile halfway (named by its share of the run, so the config's
# `sample:` section fits a run of any length); at the demo's lengths both are snapshot steps, so they are
# rebuilt exactly. Chosen on seed 0 from a sweep of widths 0.02..0.18 (benchmarks/RESULTS.md).
DEMO_PHEMA_STDS = (0.05, 0.10)
MAIN_STD, GUIDE_STD = 0.05, 0.10
GUIDE = "phema/std0.100@50%"  # the guide spec (config/guide_spec.py): GUIDE_STD at the snapshot nearest half the run
# Snapshots: six per run (the guide's step, halfway, is the third), 11 MB each in fp16.
SNAPSHOTS = 6


def demo_steps(objective=DEMO_OBJECTIVE, steps=None) -> int:
    """`steps`, or the demo's own length for `objective`; ConfigError for an objective it lacks."""
    if objective not in DEMO_STEPS:
        raise ConfigError(f"demo objective {objective!r} is not one of {sorted(DEMO_STEPS)}")
    return DEMO_STEPS[objective] if steps is None else steps


def snapshot_every(steps: int) -> int:
    """Steps between post-hoc EMA snapshots of a demo run of `steps` steps."""
    return max(1, steps // SNAPSHOTS)


def recommended_sampling(objective: str) -> dict:
    """The `sample:` section the demo records: how its samples are drawn (chosen on seed 0, reported on seed 1:
    benchmarks/RESULTS.md, "Guidance and post-hoc EMA on the digits")."""
    if objective == "meanflow":
        return meanflow_demo.sampling()
    # The guide is the run halfway (its 0.10 profile): autoguidance weight 2 with a touch of classifier-free
    # guidance (1.1), both only above noise level 1, where the digit's shape is decided: recognised as often
    # as guidance 1.2 everywhere, at a lower FID and with more variety.
    common = {"guide": GUIDE, "guide_scale": 2.0, "guidance_interval": [1.0, float("inf")], "cfg_scale": 1.1,
              "ema_std": MAIN_STD}
    if objective == "transport":
        return {**common, "steps": 9}  # 9 midpoint steps (16 evaluations per branch) scored as 25 did
    return {**common, "sampler": "ddim", "steps": 16}  # the same network evaluations as DDIM


def demo_config(out="outputs/demo", steps=None, seed=0, objective=DEMO_OBJECTIVE,
                fid_samples=DEMO_FID_SAMPLES) -> dict:
    """The demo's config: a small DiT-S/4-shaped model sized for two CPU cores.

    Tuned so that the whole `dit demo` stays under 3 minutes on two cores with >= 97% of the
    samples recognised (`python scripts/demo/demo_check.py` measures both). `objective="transport"`
    (SiT): a linear interpolant with velocity prediction, sampled by the probability-flow ODE;
    `"diffusion"` (DiT): Gaussian diffusion sampled by DDIM. `steps=None`: the objective's own.
    `fid_samples` is the number of samples drawn at the end (`run_demo`); the config itself measures no FID.
    """
    steps = demo_steps(objective, steps)
    cfg = {
        "output_dir": str(out),
        "objective": objective,
        # A fixed-step 2nd-order ODE solver for 16x16 digits.
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
        # The EMA that samples is the post-hoc one (its width chosen after training); the fixed EMA is
        # left off (decay 0: ema.safetensors holds the raw weights), since no fixed width is right for both
        # the main model and its guide.
        "train": {"max_steps": int(steps), "global_batch_size": 64, "seed": int(seed), "mixed_precision": "fp32",
                  "ema_decay": 0.0, "ema_warmup": True, "phema_stds": list(DEMO_PHEMA_STDS),
                  "phema_every": snapshot_every(int(steps))},
        "checkpoint": {"save_steps": 1000, "save_total_limit": 1},
        "logging": {"log_steps": 50, "image_steps": 0, "tensorboard": False, "sample_steps": 25,
                    "sample_cfg_scale": 4.0, "samples_per_class": 10},
        "sample": recommended_sampling(objective),
    }
    for section, values in (meanflow_demo.settings(int(steps)) if objective == "meanflow" else {}).items():
        cfg[section] = {**cfg[section], **values} if isinstance(values, dict) and section in cfg else values
    return cfg


def sampling_settings(out, num_samples, device, progress):
    """The SampleSettings of the demo's batch: `dit sample-ddp`'s defaults with the run's `sample:` section in `out`.
    Its seed (0) stays as it is, so runs of every `--seed` are compared on the same starting noise."""
    from dit_trainer import checkpoint
    from dit_trainer.sample.settings import resolve

    given = {"ckpt": str(out), "npz": str(Path(out) / "samples.npz"), "num_samples": int(num_samples),
             "batch_size": 250, "device": str(device), "overwrite": True, "progress": bool(progress)}
    return resolve(given, checkpoint.open(out).config().sample, release_cfg_scale=1.5)


def draw_recommended(out, num_samples, device, progress=False):
    """(the samples .npz, its SampleSettings): `num_samples` drawn as the run in `out` recommends, the post-hoc EMA
    folders it names (the main model's at the last step, the guide's halfway) rebuilt first where missing."""
    from dit_trainer import checkpoint
    from dit_trainer.sample.cli import load_vae, prepare_sampling
    from dit_trainer.sample.fid_batch import write_fid_batch

    settings = sampling_settings(out, num_samples, device, progress)
    sampling = prepare_sampling(settings, checkpoint.open(out), device)
    load_vae(sampling)
    return write_fid_batch(settings, sampling.reader, sampling), settings


def recognised(npz) -> float:
    """The share of a digits .npz (ADM format, labels in arr_1) that a classifier fit on the real digits labels
    as the class asked for."""
    import numpy as np

    from dit_trainer.data.digits import classify_images
    from dit_trainer.sample.images import from_adm_images

    with np.load(npz) as f:
        images, labels = from_adm_images(f["arr_0"], channels=1), f["arr_1"]
    return float((classify_images(images) == labels).mean())


def measure(npz, device, progress=False) -> dict:
    """FID, precision and recall of a samples .npz against all real digits (digit network), and the share
    recognised."""
    from dit_trainer.evaluate.evaluator import DIGITS_REF, evaluate

    result = evaluate(npz, DIGITS_REF, "digits", device=device, progress=progress)
    return {**{k: result[k] for k in ("fid", "precision", "recall")}, "recognised": recognised(npz),
            "fid_samples": result["num_samples"]}


def grid_of(npz, path, per_class):
    """The first `per_class` samples of each class of an ADM .npz, one row per class, enlarged 4x."""
    import numpy as np
    from PIL import Image

    from dit_trainer.sample.images import from_adm_images, save_grid

    with np.load(npz) as f:
        images, labels = f["arr_0"], f["arr_1"]
    rows = [np.flatnonzero(labels == c)[:per_class] for c in range(10)]
    order = np.concatenate([r for r in rows if len(r)])
    grid = save_grid(from_adm_images(images[order], channels=1), path, nrow=per_class)
    # 16-pixel digits are too small to judge on screen: enlarge 4x without smoothing.
    with Image.open(grid) as im:
        im.resize((im.width * 4, im.height * 4), Image.NEAREST).save(grid)
    return grid


def run_demo(out="outputs/demo", steps=None, seed=0, per_class=10, progress=True,
             objective=DEMO_OBJECTIVE, fid_samples=DEMO_FID_SAMPLES) -> dict:
    """Train, rebuild the post-hoc EMA, draw `fid_samples` samples as the run recommends (samples.npz, ADM
    format), score them (FID, precision, recall, recognised) and write samples.png and loss.png into `out`;
    returns a summary (only `stopped`, `steps` and `train_seconds` when a signal stopped the training)."""
    from dit_trainer.config import build_config
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.train import DiTTrainer
    from dit_trainer.train.metrics import read_metrics

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
    num = int(fid_samples) if fid_samples else 10 * per_class
    if objective == "meanflow":  # its own few-step sampler, at each of its step counts
        npzs = draw_meanflow(out, num, trainer.device)
        npz, sampling = npzs[meanflow_demo.SAMPLE_STEPS[0]], describe_meanflow()
    else:
        npz, sampled = draw_recommended(out, num, trainer.device, progress)
        sampling = describe(sampled)
    grid = grid_of(npz, out / "samples.png", per_class)
    family = {"transport": "SiT", "meanflow": "MeanFlow"}.get(objective, "DiT")
    loss_png = plot_loss(out / "metrics.jsonl", out / "loss.png", title=f"dit demo: {family} on scikit-learn digits")
    summary = {"samples": str(grid), "loss_plot": str(loss_png), "train_seconds": train_s, "steps": trainer.step,
               "already_finished": already_finished, "sampling": sampling, "num_samples": num}
    if fid_samples:
        scores = measure(npz, trainer.device)
        if objective == "meanflow":  # the further step counts' scores beside the first's
            for k in meanflow_demo.SAMPLE_STEPS[1:]:
                scores.update({f"{key}_{k}_steps": v for key, v in measure(npzs[k], trainer.device).items()
                               if key in ("fid", "recognised")})
        summary.update(scores)
        logged = [r for r in read_metrics(out / "metrics.jsonl") if r.get("step") == trainer.step and "fid" in r]
        if not logged:  # once per run: a finished run sampled again logs nothing new
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": trainer.step, **scores, "sampling": summary["sampling"]}) + "\n")
    return summary


def draw_meanflow(out, num_samples, device) -> dict:
    """{steps: samples .npz} for each of the MeanFlow demo's step counts: `num_samples`, every class alike, from
    the post-hoc EMA of its width rebuilt at the last step, by the objective's own sampler on the demo's schedule
    for that count, unguided."""
    import numpy as np

    from dit_trainer import checkpoint
    from dit_trainer.objective import build_objective
    from dit_trainer.phema import reconstruct
    from dit_trainer.sample.decode import load_decoder, to_images
    from dit_trainer.sample.images import save_npz
    from dit_trainer.sample.loading import load_model
    from dit_trainer.sample.sampling import sample_latents

    step = checkpoint.open(out).config().train.max_steps
    (folder,) = reconstruct(out, [meanflow_demo.MAIN_STD], at_step=step)
    model, cfg = load_model(folder)
    model.to(device)
    objective = build_objective(cfg)
    labels = np.arange(num_samples) % model.num_classes
    npzs = {}
    for k in meanflow_demo.SAMPLE_STEPS:
        x = sample_latents(model, objective, labels, cfg_scale=1.0, steps=k, seed=0, device=device,
                           timesteps=list(meanflow_demo.SCHEDULES[k]))
        images = to_images(x, *load_decoder(cfg, device=device))
        npzs[k] = save_npz(Path(out) / f"samples_{k}step.npz", images, labels, settings={"steps": k, "ckpt": str(folder)})
    return npzs


def describe_meanflow() -> str:
    """The MeanFlow demo's sampling, in words."""
    steps = " and ".join(map(str, meanflow_demo.SAMPLE_STEPS))
    times = " and ".join(", ".join(f"{t:g}" for t in meanflow_demo.SCHEDULES[k]) for k in meanflow_demo.SAMPLE_STEPS)
    return f"MeanFlow's sampler at {steps} steps (t {times}), unguided, post-hoc EMA {meanflow_demo.MAIN_STD}"


def describe(settings) -> str:
    """A SampleSettings' sampling, in words."""
    from dit_trainer.sample.sweep import describe as spec

    return f"{spec(settings)}, {settings.steps} steps"


def add_commands(sub) -> None:
    """Register `dit demo`."""
    p = sub.add_parser("demo", help="train a small DiT-shaped SiT on scikit-learn's digits and draw a sample grid "
                                    "(CPU, minutes); --text: a small PixArt on the digits captioned by what they show")
    p.add_argument("--text", action="store_true",
                   help="text-conditioned: a PixArt learns the digits from captions of their name, stroke weight and "
                        "slant (some combinations held out), a tiny frozen T5 encoding them; scores prompt following")
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps (default: {DEMO_STEPS['transport']} as SiT, {DEMO_STEPS['diffusion']} as DiT; "
                        "--text: 700)")
    p.add_argument("--out", default=None, help="output folder (default: outputs/demo, --text: outputs/demo_text)")
    p.add_argument("--seed", type=int, default=0, help="seed of data order, training noise and weights (the samples at "
                                                       "the end start from the same noise for every seed)")
    p.add_argument("--per-class", type=int, default=10, help="samples per digit in the grid (--text: per prompt)")
    p.add_argument("--fid-samples", type=int, default=None,
                   help=f"samples drawn at the end as the run recommends, scored (FID against the real digits with "
                        f"the digit network, precision, recall, recognised; default {DEMO_FID_SAMPLES}); 0: only the "
                        "grid's, unscored; --text: the captions of this many real digits (default all 1797), scored "
                        "for prompt following and FID")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--objective", choices=("diffusion", "transport", "meanflow"), default=DEMO_OBJECTIVE,
                   help="interpolant transport (SiT, the default), Gaussian diffusion (DiT) or MeanFlow (sampled in "
                        "1 and 2 steps)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the demo and say where its pictures are."""
    if args.text:
        from dit_trainer.demo_text import run as run_text

        return run_text(args)
    args.out = "outputs/demo" if args.out is None else args.out
    args.fid_samples = DEMO_FID_SAMPLES if args.fid_samples is None else args.fid_samples
    if args.fid_samples != 0 and args.fid_samples < 10:
        raise ConfigError(f"--fid-samples is {args.fid_samples}; the scores need at least 10 samples (0: none)")
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
    print(f"sampled {summary['num_samples']} as the run recommends ({summary['sampling']}; its sample: section)")
    if "fid" in summary:
        print(f"a digit classifier trained on the real digits recognises {summary['recognised']:.1%} of them")
        print(f"FID against the real digits (digit network, {summary['fid_samples']} samples at step "
              f"{summary['steps']}): {summary['fid']:.2f} (precision {summary['precision']:.2f}, recall "
              f"{summary['recall']:.2f})")
        for k in meanflow_demo.SAMPLE_STEPS[1:] if args.objective == "meanflow" else ():
            print(f"at {k} steps: FID {summary[f'fid_{k}_steps']:.2f}, {summary[f'recognised_{k}_steps']:.1%} recognised")
    print(f"samples: {summary['samples']}\nloss curve: {summary['loss_plot']}")
    return 0
