"""`dit demo --text`: a small PixArt learns scikit-learn's digits from captions of what each shows, on a CPU.

Each digit is captioned by what its pixels show ("a bold right-slanted seven": its name, its stroke
weight and its slant, measured as `data.digit_attributes` says), with ten (digit, weight, slant)
combinations never seen in training. A frozen text encoder stands in for T5-XXL: a tiny T5 with a
word-level tokenizer over the captions' words and random weights fixed by a seed, written into the
run as a transformers folder (`text_encoder/`), so sampling, export and diffusers read it as they
would a released one. Random is enough here: every caption encodes to a distinct sequence of token
vectors (each token's vector is mostly its own word's embedding), and the model's cross-attention
learns to read them; nothing would be gained by pretraining it. The model is a PixArt (cross-attention
to the caption, adaLN-single) a few blocks deep, on the digits at their own 8×8 (patch 2: 16 tokens,
as the class demo's DiT-S/4 has on 16×16), trained as SiT (interpolant transport) as `dit demo` is.

At the end it draws one sample per real digit's caption (so the prompts are as frequent as in the
data, the held-out ones included) as the run's `sample:` section recommends, and scores them:
FID against the real digits (digit network), and prompt following, the share whose digit (the
digit network's classifier), stroke weight and slant (the caption's own measures) are what the
prompt asked, for seen and held-out combinations (`prompt_following.json`). The config is
`configs/demo_digits_text.yaml`; `demo_text_config()` is its source.
"""

import json
import time
from pathlib import Path

import numpy as np

from dit_trainer.errors import ConfigError

DEMO_TEXT_STEPS = 1000  # what fits the 4-minute budget on 2 cores with the sampling and scoring
# The samples at the end: one per real digit's caption, in a fixed seeded order (the first `fid_samples`).
DEMO_TEXT_SAMPLES = 1797
ENCODER_FOLDER = "text_encoder"  # the run's text encoder, beside its checkpoints
ENCODER_SEED = 0  # the encoder's weights are fixed whatever the run's seed: every run reads the same prompts alike
TEXT_MAX_LENGTH = 8  # "a bold right-slanted seven" is 5 tokens with T5's </s>
ENCODER_WIDTH = 64  # the T5's d_model: the caption embeddings' width (model.text_hidden_size)
PHEMA_STDS = (0.05, 0.10)
SNAPSHOTS = 6


def demo_text_config(out="outputs/demo_text", steps=None, seed=0) -> dict:
    """The text demo's config: a PixArt 4 blocks deep and 192 wide on the captioned 8×8 digits."""
    steps = DEMO_TEXT_STEPS if steps is None else int(steps)
    return {
        "output_dir": str(out),
        "objective": "transport",
        # SD3's logit-normal density on t: more of the steps where the digit's shape, weight and slant are
        # decided (on seeds 1 and 2: weight +2, slant +2 points and FID 42 -> 30 against uniform t).
        "transport": {"path_type": "Linear", "prediction": "velocity", "ode_method": "midpoint",
                      "t_sampler": "logit-normal"},
        # PixArt-alpha 256's member of the family (positions at scale 1, no micro-conditions), resized.
        "model": {"name": "PixArt-alpha-XL/2-256", "input_size": 8, "in_channels": 1, "learn_sigma": False,
                  "depth": 4, "hidden_size": 192, "num_heads": 4, "text_hidden_size": ENCODER_WIDTH},
        "data": {"path": "digits", "digits_size": 8, "num_workers": 0, "random_flip": False,
                 "text_encoder": str(Path(out) / ENCODER_FOLDER), "text_max_length": TEXT_MAX_LENGTH,
                 "text_dtype": "fp32", "caption_dropout_prob": 0.1,
                 "val_split": 0},  # the demo scores its own samples at the end; every digit trains
        # Cosine decay to 0 after warmup: on seeds 1 and 2 stroke weight and slant followed the prompt more often,
        # seen 85.4 / 79.1 -> 85.9 / 80.6 and 85.2 / 80.0 -> 87.8 / 82.2, held out 78.6 / 75.9 -> 78.6 / 79.5 and
        # 72.3 / 79.5 -> 80.4 / 83.0, at an FID 0.8 and 2.2 higher (benchmarks/RESULTS.md).
        "optim": {"lr": 2e-3, "warmup_steps": 100, "max_grad_norm": 1.0, "lr_schedule": "cosine"},
        "train": {"max_steps": steps, "global_batch_size": 64, "seed": int(seed), "mixed_precision": "fp32",
                  "ema_decay": 0.0, "ema_warmup": True, "phema_stds": list(PHEMA_STDS),
                  "phema_every": max(1, steps // SNAPSHOTS)},
        "checkpoint": {"save_steps": 1000, "save_total_limit": 1},
        "logging": {"log_steps": 50, "image_steps": 0, "tensorboard": False},
        "sample": recommended_sampling(),
    }


def recommended_sampling() -> dict:
    """The `sample:` section the text demo records: how its samples are drawn."""
    return {"cfg_scale": 2.0, "ema_std": 0.02, "steps": 9}


def write_text_encoder(out) -> str:
    """The run's text encoder folder (`out`/text_encoder), written once: a random word-level T5 over the
    captions' words, the same for every run."""
    from dit_trainer.data.digit_attributes import caption_words
    from dit_trainer.text_encoders.word_t5 import save_word_t5

    folder = Path(out) / ENCODER_FOLDER
    if not (folder / "config.json").is_file():
        save_word_t5(folder, caption_words(), seed=ENCODER_SEED, d_model=ENCODER_WIDTH)
    return str(folder.resolve())


def sample_prompts(run, prompts, negative_prompts=None, seed=0, progress=False):
    """float N×C×H×W samples for `prompts` in one batch (8×8 digits: a few hundred MB on a CPU), drawn as `run`
    (a `sample.cli.SamplingRun` of a text model) says: its weights, sampler, steps and guidance, classifier-free
    guidance away from the encoding of "" or from `negative_prompts` (one per prompt)."""
    from dit_trainer.sample.prompts import sample_prompts as sample_text

    kw = dict(sampler=run.sampler, steps=run.settings.steps, seed=int(seed), device=run.device, progress=progress,
              **run.guidance(), **run.options)
    return sample_text(run.model, run.objective, run.condition, run.encoder, list(prompts),
                       negative_prompt=None if negative_prompts is None else list(negative_prompts), **kw).float().cpu()


def eval_prompts(num: int, seed: int = 0) -> np.ndarray:
    """Indices of `num` real digits (into load_digit_arrays(), a fixed seeded order): their captions are the
    prompts of the samples scored at the end, so prompts come as often as in the data, held-out ones too."""
    from dit_trainer.data.digit_attributes import digit_captions

    total = len(digit_captions().digits)
    if not 1 <= num <= total:
        raise ConfigError(f"--fid-samples {num}: the text demo draws one sample per real digit's caption, 1..{total}")
    return np.random.default_rng(seed).permutation(total)[:num]


def grid_rows() -> list:
    """The grid's prompts as (digit, weight, slant): per digit its held-out combination, then a seen one
    unlike it (the other extreme of weight and slant; for an all-middle held-out triple, thin and right)."""
    from dit_trainer.data.digit_attributes import HELD_OUT

    rows = []
    for d, w, s in HELD_OUT:
        rows += [(d, w, s), (d, 2 - w, 2 - s) if (w, s) != (1, 1) else (d, 0, 2)]
    return rows


def labelled_grid(images, labels, path, per_row: int, scale: int = 6) -> Path:
    """`images` (rows of `per_row`) as a grid enlarged `scale`× without smoothing, each row's label left of it."""
    from PIL import Image, ImageDraw

    from dit_trainer.fs import staged_file
    from dit_trainer.sample.images import save_grid

    path = Path(path)
    save_grid(images, path, nrow=per_row)
    with Image.open(path) as im:
        grid = im.convert("L").resize((im.width * scale, im.height * scale), Image.NEAREST)
    draw = ImageDraw.Draw(grid)
    width = max(int(draw.textlength(text)) for text in labels) + 12
    canvas = Image.new("L", (grid.width + width, grid.height), 0)
    canvas.paste(grid, (width, 0))
    draw, row_h = ImageDraw.Draw(canvas), (grid.height - 2 * scale) / len(labels)
    for i, text in enumerate(labels):
        draw.text((6, 2 * scale + i * row_h + row_h / 2 - 6), text, fill=255)
    with staged_file(path) as tmp:
        canvas.save(tmp, format="PNG")
    return path


def sampling_run(out, device, progress=False, **given):
    """The `SamplingRun` of the text run in `out` (its text encoder the run's), as its `sample:` section recommends
    where `given` (`SampleSettings` fields) does not say (post-hoc EMA folders rebuilt where missing)."""
    from dit_trainer import checkpoint
    from dit_trainer.data.digit_attributes import caption
    from dit_trainer.sample.cli import prepare_sampling
    from dit_trainer.sample.settings import resolve

    reader = checkpoint.open(out)
    # The prompts say the run is sampled from captions; each call names its own.
    given = {"ckpt": str(out), "device": str(device), "progress": bool(progress), "prompts": (caption(0),), **given}
    return prepare_sampling(resolve(given, reader.config().sample), reader, device)


def train(out, steps=None, seed=0, progress=True, **sections):
    """(trainer, its train() metrics, seconds) of the text demo trained into `out` (its text encoder written
    first); `sections` replace keys of `demo_text_config`'s sections (benchmarks try other settings)."""
    from dit_trainer.config import build_config
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.train import DiTTrainer

    write_text_encoder(out)
    config = demo_text_config(Path(out).resolve(), steps, seed)
    for section, keys in sections.items():
        config[section] = {**config.get(section, {}), **keys}
    cfg = build_config(config)
    cfg.logging.progress = progress
    trainer = DiTTrainer(cfg)
    keep_freed_memory_on(trainer.device)  # the demo is a whole command's run: the process-wide setting is its own
    t0 = time.perf_counter()
    metrics = trainer.train(max_steps_name="--steps")
    return trainer, metrics, time.perf_counter() - t0


def draw_and_score(out, asked, device, progress=False, negative=None, **given) -> dict:
    """Draw one sample per caption of real digits `asked` (indices) from the run in `out` as it recommends (or as
    `given` says), write them to `out`/samples.npz and score them: {"images", "settings", "fid", "precision",
    "recall", "prompt_following", "sample_seconds"}."""
    from dit_trainer.data.digit_attributes import caption, digit_captions
    from dit_trainer.evaluate.digit_prompts import prompt_following
    from dit_trainer.evaluate.evaluator import DIGITS_REF, evaluate
    from dit_trainer.sample.images import save_npz

    run = sampling_run(out, device, progress, **given)
    known = digit_captions()
    prompts = [known.prompts[i] for i in asked]
    t0 = time.perf_counter()
    alone = [caption(int(d)) for d in known.digits[asked]]
    images = sample_prompts(run, prompts, None if negative is None else alone, seed=0, progress=progress)
    sample_s = time.perf_counter() - t0
    s = run.settings
    settings = {"ckpt": str(run.reader.path), "cfg_scale": s.cfg_scale, "steps": s.steps, "seed": 0,
                "negative_prompt": "the digit alone" if negative else '""',
                "guide": str(run.guide_reader.path) if run.guide_reader is not None else None,
                "guide_scale": s.guide_scale, "guidance_interval": s.guidance_interval}
    npz = save_npz(Path(out) / "samples.npz", images, known.digits[asked], settings=settings,
                   extra={"prompts": np.array(prompts), "weights": known.weights[asked],
                          "slants": known.slants[asked], "held_out": known.held_out[asked]})
    result = evaluate(npz, DIGITS_REF, "digits", device=device, progress=False)
    following = prompt_following(images, known.digits[asked], known.weights[asked], known.slants[asked],
                                 known.thresholds, device)
    return {"images": images, "settings": settings, **{k: result[k] for k in ("fid", "precision", "recall")},
            "prompt_following": following, "sample_seconds": sample_s, "run": run}


def run_demo_text(out="outputs/demo_text", steps=None, seed=0, per_row=8, progress=True,
                  fid_samples=DEMO_TEXT_SAMPLES) -> dict:
    """Train, then draw one sample per caption of `fid_samples` real digits and the grid as the run recommends;
    write samples.npz (ADM format, with each sample's prompt), samples.png, loss.png and prompt_following.json
    into `out`; returns a summary (only `stopped`, `steps` and `train_seconds` when a signal stopped training)."""
    from dit_trainer.data.digit_attributes import HELD_OUT, caption, digit_captions
    from dit_trainer.plot import plot_loss
    from dit_trainer.train.metrics import read_metrics

    out = Path(out)
    asked = eval_prompts(int(fid_samples))
    trainer, metrics, train_s = train(out, steps, seed, progress)
    if trainer.stop_requested:
        # SIGTERM/Ctrl-C: the checkpoint is saved; sampling a half-trained model is not what was asked.
        return {"stopped": True, "steps": trainer.step, "train_seconds": train_s}
    # A finished run in `out` is resumed and sampled again without a step, and logs nothing.
    already_finished = not metrics and trainer.step >= trainer.cfg.train.max_steps
    drawn = draw_and_score(out, asked, trainer.device, progress)
    scores = {k: drawn[k] for k in ("fid", "precision", "recall", "prompt_following")}
    report = {"steps": trainer.step, "seed": trainer.cfg.train.seed, "samples": len(asked), **scores,
              "held_out": [caption(*t) for t in HELD_OUT], "sampling": drawn["settings"],
              "thresholds": digit_captions().thresholds.to_dict()}
    (out / "prompt_following.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = grid_rows()
    grid_images = sample_prompts(drawn["run"], [caption(*r) for r in rows for _ in range(per_row)],
                                 seed=1)
    labels = [caption(*r) + (" (held out)" if r in HELD_OUT else "") for r in rows]
    grid = labelled_grid(grid_images, labels, out / "samples.png", per_row)
    loss_png = plot_loss(out / "metrics.jsonl", out / "loss.png", title="dit demo --text: PixArt on captioned digits")
    logged = [r for r in read_metrics(out / "metrics.jsonl") if r.get("step") == trainer.step and "fid" in r]
    if not logged:  # once per run: a finished run sampled again logs nothing new
        flat = {f"{kind}_{k}": v for kind, row in scores["prompt_following"].items() for k, v in row.items()}
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": trainer.step, **{k: scores[k] for k in ("fid", "precision", "recall")},
                                **flat}) + "\n")
    return {**scores, "samples": str(grid), "loss_plot": str(loss_png), "train_seconds": train_s,
            "sample_seconds": drawn["sample_seconds"], "steps": trainer.step, "already_finished": already_finished,
            "num_samples": len(asked), "report": str(out / "prompt_following.json"), "settings": drawn["settings"]}


def run(args) -> int:
    """`dit demo --text`: run it and say where its pictures and scores are."""
    from dit_trainer.evaluate.digit_prompts import table_lines

    if args.objective != "transport":
        raise ConfigError(f"--objective {args.objective}: the text demo trains as SiT (transport) only")
    steps = DEMO_TEXT_STEPS if args.steps is None else args.steps
    out = args.out or "outputs/demo_text"
    summary = run_demo_text(out, steps, args.seed, args.per_class, progress=not args.no_progress,
                            fid_samples=DEMO_TEXT_SAMPLES if args.fid_samples is None else args.fid_samples)
    if summary.get("stopped"):
        print(f"stopped at step {summary['steps']} of {steps}; the checkpoint is in {out}/checkpoints: rerun the "
              "same dit demo --text command to continue")
        return 0
    if summary["already_finished"]:
        print(f"{out} holds a finished run of {summary['steps']} steps: no training, sampled it again")
    else:
        print(f"trained {summary['steps']} steps in {summary['train_seconds']:.0f} s")
    s = summary["settings"]
    print(f"sampled {summary['num_samples']} prompts (the captions of as many real digits) in "
          f"{summary['sample_seconds']:.0f} s as the run recommends (cfg={s['cfg_scale']}, {s['steps']} steps)")
    print("prompt following (digit by the digit network, weight and slant by the captions' pixel measures):")
    print("\n".join("  " + line for line in table_lines(summary["prompt_following"])))
    print(f"FID against the real digits (digit network, {summary['num_samples']} samples at step {summary['steps']}): "
          f"{summary['fid']:.2f} (precision {summary['precision']:.2f}, recall {summary['recall']:.2f})")
    print(f"samples: {summary['samples']}\nscores: {summary['report']}\nloss curve: {summary['loss_plot']}")
    return 0
