"""`SampleSettings`: everything a sampling command samples with, as one typed value resolved once.

Each setting comes from the command's flags first, then the run's `sample:` section (what the run
recommends, e.g. what `dit demo` found best), then the command's release default (`resolve`). `dit sample`,
`dit sample-ddp`, its guidance sweep (one value per SPEC) and `dit demo` hand that value on; nothing
after `resolve` reads the command line. Torch-free.
"""

import dataclasses
import math
from typing import Optional

from dit_trainer.errors import ConfigError

# The flags of the sampler-specific argument group, by dest: the objective says which its sampler takes.
SAMPLER_FLAGS = ("ode_method", "atol", "rtol", "sde_method", "sde_diffusion_form", "sde_diffusion_norm", "sde_last_step",
                 "sde_last_step_size")


@dataclasses.dataclass(frozen=True)
class SampleSettings:
    """How samples are drawn, resolved: the checkpoint and its weights, guidance, sampler, decoding, the FID batch.

    A setting a later kind of model needs (a text-to-image model's prompts, a few-step objective's step
    schedule) is a field here with a default that samples as before, taken in `resolve` from its flag, else
    the run's `sample:` key of the same name, else that default; `SampleConfig` gets the key where a run
    can recommend it."""

    # The checkpoint and how its model is read (model, image_size, num_classes: for a bare weights file).
    ckpt: str
    weights: str = "ema"  # ema | model
    model: Optional[str] = None
    image_size: Optional[int] = None
    num_classes: int = 1000
    ema_std: Optional[float] = None  # the post-hoc EMA of this sigma_rel (rebuilt when missing); None: ema.safetensors
    # Guidance (sample/guidance.py).
    cfg_scale: float = 1.5
    cfg_channels: Optional[int] = None
    guide: Optional[str] = None  # autoguidance's guide spec (config/guide_spec.py); None: no autoguidance
    guide_origin: str = "--guide"  # the flag or key that named `guide`: a config's path is relative to its run
    guide_scale: float = 1.0  # 1 exactly when `guide` is None
    guidance_interval: Optional[tuple] = None  # (sigma_lo, sigma_hi]; None: every step
    # The sampler.
    sampler: Optional[str] = None  # None: the objective's release sampler (ddpm, ode)
    steps: Optional[int] = None  # None: the sampler's default
    sampler_options: tuple = ()  # ((dest, value), ...) of the SAMPLER_FLAGS given, checked against the sampler
    seed: int = 0
    dtype: str = "fp32"  # network precision: fp32 | bf16
    # Decoding.
    vae: Optional[str] = None  # None: the run's recorded VAE
    vae_dtype: str = "fp32"
    # An FID batch (`dit sample --npz`, `dit sample-ddp`).
    npz: Optional[str] = None
    num_samples: int = 50000
    batch_size: int = 32
    overwrite: bool = False
    # Running.
    device: str = "auto"
    compile: str = "auto"  # auto | true | false
    progress: bool = True
    # Conditioning of text-to-image models (a class-conditional model refuses them).
    prompts: Optional[tuple] = None  # the prompts (--prompt, or --prompts FILE's lines); None: class labels
    negative_prompt: Optional[str] = None  # guidance's unconditional caption; None: "" (the null caption)
    text_encoder: Optional[str] = None  # the text encoder folder or id; None: the run's recorded one
    # The step schedules of few-step objectives join here.

    @property
    def options(self) -> dict:
        """The sampler-specific options given, as `objective.sample` keywords."""
        return dict(self.sampler_options)


_FIELDS = {f.name for f in dataclasses.fields(SampleSettings)}


def given_of(args) -> dict:
    """The flags of a parsed sampling command that are settings (unset ones None), `--no-progress` as progress,
    `--prompt` / `--prompts FILE` as the prompts."""
    given = {k: v for k, v in vars(args).items() if k in _FIELDS}
    given["progress"] = not getattr(args, "no_progress", False)
    given["prompts"] = prompts_of(args)
    given["sampler_options"] = tuple((k, getattr(args, k)) for k in SAMPLER_FLAGS if getattr(args, k, None) is not None)
    return given


def prompts_of(args):
    """The prompts a sampling command was given (`--prompt TEXT ...` or `--prompts FILE`), as a tuple, or None."""
    if getattr(args, "prompt", None):
        from dit_trainer.sample.prompt_text import check_prompts

        return tuple(check_prompts(args.prompt))
    if getattr(args, "prompts_file", None):
        from dit_trainer.sample.prompt_text import read_prompts

        return read_prompts(args.prompts_file)
    return None


def from_flags(args, recommended=None) -> SampleSettings:
    """The settings of a parsed sampling command, the unset ones from `recommended` (a run's `sample:` section)."""
    return resolve(given_of(args), recommended, args.release_cfg_scale)


def check_flags(given: dict) -> None:
    """One-line errors for given values no sampling can use (before any checkpoint is read)."""
    cfg_scale, guide_scale = given.get("cfg_scale"), given.get("guide_scale")
    if cfg_scale is not None and (not cfg_scale >= 1 or not math.isfinite(cfg_scale)):
        raise ConfigError(f"--cfg-scale is {cfg_scale}; it must be a number >= 1 (1 disables guidance)")
    if guide_scale is not None and not (guide_scale >= 1 and math.isfinite(guide_scale)):
        raise ConfigError(f"--guide-scale is {guide_scale}; it must be a number >= 1 (1: no autoguidance)")
    if given.get("guidance_interval") is not None:
        from dit_trainer.config.checks import guidance_interval

        guidance_interval(given["guidance_interval"], "--guidance-interval")
    if given.get("guide") is not None:
        from dit_trainer.config.guide_spec import parse_guide

        parse_guide(given["guide"], "--guide")
    if given.get("ema_std") is not None and str(given["ema_std"]).strip().lower() != "none":
        _ema_std(given["ema_std"])
    for key in ("steps", "num_samples", "batch_size", "cfg_channels", "image_size", "num_classes"):
        value = given.get(key)
        if value is not None and value < 1:
            raise ConfigError(f"--{key.replace('_', '-')} is {value}; it must be 1 or more")


def resolve(given: dict, recommended=None, release_cfg_scale: float = 1.5) -> SampleSettings:
    """The settings: each from `given` (flag values, None for unset), else `recommended` (a run's `sample:`
    section, or None), else the release default (`release_cfg_scale` for classifier-free guidance).

    `ema_std` "none" asks for the checkpoint's own EMA whatever the run recommends; a guide weight of 1 turns
    a recommended autoguidance off; a guide weight with no guide at all is refused, not ignored."""
    values = {k: v for k, v in given.items() if k in _FIELDS and v is not None}
    ema_none = isinstance(values.get("ema_std"), str) and values["ema_std"].strip().lower() == "none"
    origin = values.get("guide_origin", "--guide")
    # Every key of the run's `sample:` section (SampleConfig) recommends the setting of the same name.
    recommends = [f.name for f in dataclasses.fields(recommended)] if recommended is not None else []
    for key in recommends:
        if key in values or (key == "ema_std" and ema_none):
            continue
        if getattr(recommended, key) is not None:
            values[key] = getattr(recommended, key)
            if key == "guide":
                origin = "sample.guide"
    values.setdefault("cfg_scale", release_cfg_scale)
    values["ema_std"] = None if ema_none else _ema_std(values.get("ema_std"))
    # The values themselves were checked where they came from: the flags by `check_flags`, the run's by its config.
    guide, weight = values.get("guide"), values.get("guide_scale")
    if guide is not None and weight is None:
        raise ConfigError("--guide needs --guide-scale W, the autoguidance weight (e.g. 2.0; 1 turns it off)")
    if guide is None and weight is not None and weight != 1:
        raise ConfigError(f"--guide-scale {weight:g} needs a guide, and neither --guide nor the run's sample.guide "
                          f"names one; pass --guide CKPT (a step of the run such as 300, a share such as 50%, or a "
                          f"checkpoint folder), or drop --guide-scale")
    if weight is None or weight == 1:
        guide, weight = None, 1.0
    values.update(guide=None if guide is None else str(guide), guide_scale=float(weight), guide_origin=origin,
                  cfg_scale=float(values["cfg_scale"]))
    if values.get("guidance_interval") is not None:
        from dit_trainer.config.checks import guidance_interval

        values["guidance_interval"] = guidance_interval(values["guidance_interval"], "--guidance-interval")
    return SampleSettings(**values)


def _ema_std(value):
    """A post-hoc EMA width as a float (None stays None); a one-line error for anything but a positive number."""
    if value is None or isinstance(value, float):
        return value
    try:
        std = float(value)
    except (TypeError, ValueError):
        std = math.nan
    if not (std > 0 and math.isfinite(std)):
        raise ConfigError(f"--ema-std is {value!r}; it must be a positive sigma_rel such as 0.05, or none")
    return std
