"""The allowed values of each config key, checked when a config is built.

A value outside its range would otherwise surface minutes later as a ZeroDivisionError, an EMA
that explodes or an all-black sample grid; here it is one line naming the key, the value and
what is allowed. The model family's own options are checked by the family (see models/spec.py).
"""

import math

from dit_trainer.config.guide_spec import PHEMA_MAX_STD, keep_eval_guide, parse_guide
from dit_trainer.errors import ConfigError
from dit_trainer.meanflow.config import check_meanflow
from dit_trainer.repa.config import check_repa

# Every objective's samplers (Objective.samplers): diffusion's, transport's, MeanFlow's.
SAMPLERS = ("ddpm", "ddim", "ode", "sde", "meanflow")

# (key, test, what is allowed). Tests are written so that NaN fails them.
_RANGES = (
    ("model.input_size", lambda v: v > 0, "a positive integer"),
    ("model.in_channels", lambda v: v > 0, "a positive integer"),
    ("model.num_classes", lambda v: v > 0, "a positive integer"),
    ("model.class_dropout_prob", lambda v: 0 <= v < 1, "a probability in [0, 1)"),
    ("diffusion.num_timesteps", lambda v: v > 0, "a positive integer"),
    ("diffusion.timestep_mean", lambda v: math.isfinite(v), "a finite number"),
    ("diffusion.timestep_std", lambda v: v > 0 and math.isfinite(v), "a positive number such as 1.0"),
    ("diffusion.min_snr_gamma", lambda v: v > 0 and math.isfinite(v), "a positive number such as 5.0"),
    ("data.num_workers", lambda v: v >= 0, "0 or more"),
    ("data.image_size", lambda v: v > 0, "a positive integer"),
    ("data.digits_size", lambda v: v > 0, "a positive integer"),
    ("data.scaling_factor", lambda v: v > 0 and math.isfinite(v), "a positive number"),
    ("data.text_max_length", lambda v: v >= 0, "0 (the model family's default) or a positive number of tokens"),
    ("data.caption_dropout_prob", lambda v: 0 <= v < 1, "a probability in [0, 1)"),
    ("optim.lr", lambda v: v > 0 and math.isfinite(v), "a positive number such as 1e-4"),
    ("optim.weight_decay", lambda v: v >= 0 and math.isfinite(v), "0 or more"),
    ("optim.beta1", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("optim.beta2", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("optim.eps", lambda v: v > 0 and math.isfinite(v), "a positive number such as 1e-8"),
    ("optim.warmup_steps", lambda v: v >= 0, "0 or more"),
    ("optim.decay_steps", lambda v: v >= 0, "0 (decay over the whole run after warmup) or more"),
    ("optim.min_lr", lambda v: v >= 0 and math.isfinite(v), "0 or more, below optim.lr"),
    ("optim.max_grad_norm", lambda v: v >= 0 and math.isfinite(v), "0 (no clipping) or more"),
    ("train.max_steps", lambda v: 0 <= v < 2**53, "0 or more, below 2**53"),
    ("train.global_batch_size", lambda v: v > 0, "a positive integer"),
    ("train.grad_accum_steps", lambda v: v > 0, "a positive integer"),
    ("train.seed", lambda v: 0 <= v < 2**63, "an integer from 0 to 2**63 - 1"),
    ("train.ema_decay", lambda v: 0 <= v <= 1, "a number in [0, 1], e.g. 0.9999"),
    ("train.phema_every", lambda v: v >= 0, "0 (a snapshot at every checkpoint) or more"),
    ("train.routing_keep", lambda v: 0 < v <= 1, "a fraction in (0, 1], e.g. 0.5; 1 routes no token"),
    ("train.activation_memory_budget", lambda v: 0 < v <= 1, "a fraction in (0, 1], e.g. 0.8; 1 keeps every activation"),
    ("checkpoint.save_steps", lambda v: v > 0, "a positive integer"),
    ("checkpoint.save_total_limit", lambda v: v >= 0, "0 (keep all) or more"),
    ("logging.log_steps", lambda v: v > 0, "a positive integer"),
    ("logging.image_steps", lambda v: v >= 0, "0 (no grids) or more"),
    ("logging.sample_steps", lambda v: v > 0, "a positive integer"),
    ("logging.sample_cfg_scale", lambda v: v >= 1, "1 (no guidance) or more"),
    ("logging.samples_per_class", lambda v: v > 0, "a positive integer"),
    ("logging.peak_tflops", lambda v: v >= 0 and math.isfinite(v), "0 (measure it) or more"),
    ("eval.every", lambda v: v >= 0, "0 (no FID during training) or more"),
    ("eval.num_samples", lambda v: v >= 2, "an integer >= 2 (FID fits a covariance)"),
    ("eval.sample_batch_size", lambda v: v > 0, "a positive integer"),
    ("eval.sample_steps", lambda v: v > 0, "a positive integer"),
    ("eval.cfg_scale", lambda v: v >= 1, "1 (no guidance) or more"),
    ("eval.ref_images", lambda v: v == 0 or v >= 2, "0 (every training image) or an integer >= 2"),
    ("parallel.dp_replicate", lambda v: v > 0 or v == -1, "-1 (the rest of the world size) or a positive integer"),
    ("parallel.dp_shard", lambda v: v > 0 or v == -1, "-1 (the rest of the world size) or a positive integer"),
    ("parallel.tp", lambda v: v > 0 or v == -1, "-1 (the rest of the world size) or a positive integer"),
    ("parallel.pp", lambda v: v > 0 or v == -1, "-1 (the rest of the world size) or a positive integer"),
    ("parallel.pp_microbatches", lambda v: v > 0, "a positive integer"),
    ("parallel.timeout", lambda v: v > 0 and math.isfinite(v), "a positive number of seconds such as 600"),
)

ENGINES = ("torch", "mindspore")

_NAMES = {
    "diffusion.noise_schedule": ("linear", "cosine", "sigmoid"),
    "diffusion.timestep_sampler": ("uniform", "loss-second-moment", "logit-normal", "lognormal"),
    "diffusion.loss_weighting": ("none", "min-snr"),
    "train.mixed_precision": ("bf16", "fp16", "fp32"),
    "optim.lr_schedule": ("constant", "cosine", "linear"),
    "train.phema_dtype": ("fp16", "fp32"),
    "data.vae_dtype": ("auto", "fp32", "bf16"),
    "data.latent_norm": ("auto", "channel", "scale"),
    "data.text_dtype": ("auto", "fp32", "bf16"),
    "data.empty_captions": ("error", "drop"),
    "train.activation_checkpointing": ("none", "full", "selective"),
    "train.compile": ("auto", "true", "false"),
    "parallel.layout": ("manual", "auto"),
    "parallel.pp_schedule": ("gpipe", "1f1b", "interleaved1f1b"),
    "parallel.backend": ("auto", "nccl", "gloo"),
    "eval.network": ("auto", "inception", "digits"),
    "checkpoint.on_existing": ("refuse", "archive", "overwrite"),
}

# Names the code accepts besides the documented ones (diffusers' name of the cosine schedule).
_ALIASES = {"diffusion.noise_schedule": ("squaredcos_cap_v2",)}


def _get(cfg, key):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_device_name(name: str, key: str) -> None:
    """`auto`, `cpu`, `cuda` or `cuda:N`; whether CUDA is there is checked when the device is resolved."""
    base, _, index = str(name).partition(":")
    if base not in ("auto", "cpu", "cuda", "mps") or (index and (base != "cuda" or not index.isdigit())):
        raise ConfigError(f"{key} {name!r} is not a device; use auto, cpu, cuda or cuda:N")


def guidance_interval(value, key: str):
    """(sigma_lo, sigma_hi) of a guidance interval given as two noise levels, or None; a one-line error naming `key`."""
    if value is None:
        return None
    def number(v):
        # YAML's `.inf` is a float already; the same word in a dict or on the command line is a string.
        return math.inf if isinstance(v, str) and v.strip().lower() in (".inf", "inf", "+inf") else float(v)

    try:
        lo, hi = (number(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be two noise levels [sigma_lo, sigma_hi], got {value!r}") from None
    if not (0 <= lo < hi) or math.isnan(hi):
        raise ConfigError(f"{key} must satisfy 0 <= sigma_lo < sigma_hi (noise levels; .inf for no upper bound), "
                          f"got {list(value)!r}")
    return lo, hi


def check_guidance(section, prefix: str) -> None:
    """A section's guidance keys (`sample.*`, `eval.*`): weights in range, a guide with its weight, an interval."""
    scale = getattr(section, "cfg_scale", None)
    if scale is not None and not scale >= 1:
        raise ConfigError(f"{prefix}.cfg_scale is {scale!r}; it must be 1 (no guidance) or more")
    guide, weight = section.guide, section.guide_scale
    if weight is not None and not (weight >= 1 and math.isfinite(weight)):
        raise ConfigError(f"{prefix}.guide_scale is {weight!r}; it must be a number >= 1 (1: no autoguidance)")
    if guide is not None and weight is None:
        raise ConfigError(f"{prefix}.guide is set but {prefix}.guide_scale is not; set the autoguidance weight, e.g. 2.0")
    if weight is not None and guide is None:
        raise ConfigError(f"{prefix}.guide_scale is set but {prefix}.guide is not; name the guide checkpoint or drop it")
    interval = guidance_interval(section.guidance_interval, f"{prefix}.guidance_interval")
    # Kept as numbers, so config.yaml holds `.inf` however the user spelt it.
    section.guidance_interval = None if interval is None else list(interval)


def check_guides(cfg) -> None:
    """The guide specs parse (`config.guide_spec`), and the checkpoint eval.guide names is one the run keeps: a
    step past train.max_steps is refused; one it would not keep joins checkpoint.keep_steps, with a note."""
    import sys

    if cfg.sample.guide is not None:
        parse_guide(cfg.sample.guide, "sample.guide")
    note = keep_eval_guide(cfg)
    if note:
        print(note, file=sys.stderr)


def check_values(cfg) -> None:
    """Raise a one-line ConfigError for the first value outside what its key allows."""
    for key, ok, allowed in _RANGES:
        value = _get(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key} is {value!r}; it must be {allowed}")
    # YAML reads `compile: true` as a bool; the field keeps the lower-case word.
    cfg.train.compile = str(cfg.train.compile).lower()
    if cfg.backend not in ENGINES:
        raise ConfigError(f"backend {cfg.backend!r} is not one of {', '.join(ENGINES)}")
    for key, names in _NAMES.items():
        value = _get(cfg, key)
        if value not in names and value not in _ALIASES.get(key, ()):
            raise ConfigError(f"{key} {value!r} is not one of {'|'.join(names)}")
    from dit_trainer.objective import list_objectives

    if cfg.objective not in ("auto", *list_objectives()):
        raise ConfigError(f"objective {cfg.objective!r} is not one of {'|'.join(['auto', *list_objectives()])}")
    check_device_name(cfg.train.device, "train.device")
    if not str(cfg.output_dir).strip():
        # Path("") is the current folder: the run would write its files among the user's own.
        raise ConfigError("output_dir is empty; name the run's folder, e.g. --output_dir outputs/run")
    if cfg.train.compile_cache is None or not str(cfg.train.compile_cache).strip():
        raise ConfigError("train.compile_cache is empty; it must be auto (output_dir/compile_cache), off (torch's "
                          "default place) or a folder")
    if cfg.train.global_batch_size % cfg.train.grad_accum_steps:
        raise ConfigError(f"train.global_batch_size {cfg.train.global_batch_size} does not split into "
                          f"train.grad_accum_steps {cfg.train.grad_accum_steps} micro-batches; pick a divisor of it")
    if cfg.optim.lr_schedule == "constant":
        for key, value in (("decay_steps", cfg.optim.decay_steps), ("min_lr", cfg.optim.min_lr)):
            if value:
                raise ConfigError(f"optim.{key} {value} shapes a decay, but optim.lr_schedule is constant; set "
                                  f"optim.lr_schedule cosine or linear, or optim.{key} 0")
    elif not cfg.optim.min_lr < cfg.optim.lr:
        raise ConfigError(f"optim.min_lr {cfg.optim.min_lr} is not below optim.lr {cfg.optim.lr}; lower it, or set "
                          "optim.lr_schedule constant")
    keep = cfg.checkpoint.keep_steps
    if not all(isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in keep):
        raise ConfigError(f"checkpoint.keep_steps is {keep!r}; it must be a list of positive step numbers, e.g. [300]")
    check_latent_stats(cfg.data)
    check_guidance(cfg.sample, "sample")
    check_guidance(cfg.eval, "eval")
    check_guides(cfg)
    s = cfg.sample
    if s.ema_std is not None and not 0 < s.ema_std < PHEMA_MAX_STD:
        raise ConfigError(f"sample.ema_std is {s.ema_std!r}; it must be a post-hoc EMA width sigma_rel in "
                          f"(0, {PHEMA_MAX_STD:.4f}), such as 0.05")
    if s.sampler is not None and s.sampler not in SAMPLERS:
        raise ConfigError(f"sample.sampler {s.sampler!r} is not one of {'|'.join(SAMPLERS)}")
    if s.steps is not None and not s.steps >= 1:
        raise ConfigError(f"sample.steps is {s.steps!r}; it must be a positive integer")
    check_phema_stds(cfg)
    check_repa(cfg)
    check_meanflow(cfg)
    check_validation(cfg)
    classes = cfg.logging.sample_classes
    if classes is not None and not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c for c in classes):
        raise ConfigError(f"logging.sample_classes is {classes!r}; it must be a list of class ids (0 or more)")


def check_latent_stats(data) -> None:
    """data.latent_mean and data.latent_std: both or neither, as many finite numbers each, std > 0."""
    mean, std = data.latent_mean, data.latent_std
    if (mean is None) != (std is None):
        given, missing = ("latent_mean", "latent_std") if std is None else ("latent_std", "latent_mean")
        raise ConfigError(f"data.{given} is set but data.{missing} is not; set both (one number per latent channel)")
    if mean is not None:
        from dit_trainer.vae.latent_stats import check_stats

        check_stats(mean, std, len(mean) if isinstance(mean, (list, tuple)) else 0, "data", ConfigError)
        data.latent_mean, data.latent_std = [float(v) for v in mean], [float(v) for v in std]


def check_phema_stds(cfg) -> None:
    """train.phema_stds: distinct numbers in (0, PHEMA_MAX_STD), kept as floats."""
    stds = cfg.train.phema_stds
    for v in stds:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < PHEMA_MAX_STD:
            raise ConfigError(f"train.phema_stds holds {v!r}; each width sigma_rel must be a number in "
                              f"(0, {PHEMA_MAX_STD:.4f}) (a power-function EMA needs an exponent > 0), e.g. [0.05, 0.10]")
    if len(set(map(float, stds))) != len(stds):
        raise ConfigError(f"train.phema_stds {stds!r} names a width twice; list each once")
    cfg.train.phema_stds = [float(v) for v in stds]


def check_model(cfg) -> None:
    """`objective: auto` made the model's own (so the run's config.yaml names what it trained), then
    the objective against the model and the family's options typed and checked against its sizes."""
    from dit_trainer.config.schema import all_keys
    from dit_trainer.models.spec import family_options, objective_fits, release_objective

    if cfg.objective == "auto":
        cfg.objective = release_objective(cfg.model.name)
    objective_fits(cfg.model.name, cfg.objective, cfg.model.learn_sigma)
    elsewhere = [k for k in all_keys() if not k.startswith("model.")]
    cfg.model.options = family_options(cfg.model.name, cfg.model.options, cfg.model, elsewhere)


def check_validation(cfg) -> None:
    """The held-out data and validation keys."""
    split, every = cfg.data.val_split, cfg.eval.val_every
    for key, value in (("data.val_split", split), ("eval.val_every", every)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"{key} is {value!r}; it must be 0 or a positive integer (or unset for the default)")
    if split and cfg.data.val_path:
        raise ConfigError(f"data.val_split {split} and data.val_path {cfg.data.val_path} both name held-out data; "
                          "set one of them")
