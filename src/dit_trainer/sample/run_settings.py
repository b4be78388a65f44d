"""What a sampling command uses: its flags first, then the run's `sample:` section (what the run
recommends, e.g. what `dit demo` found best), then the command's release default.

Also where the two checkpoints besides the main one come from: the post-hoc EMA reconstruction a
`--ema-std` names (written by `dit ema`), and the autoguidance guide a `--guide` names (a step of the
same run or another run), refused in one line when it does not fit the main model.
"""

import dataclasses
import math
from pathlib import Path

from dit_trainer.config import SampleConfig
from dit_trainer.errors import CheckpointError, ConfigError

# The flags a run's `sample:` section supplies when they are not given: one per key of the section.
RECOMMENDED = tuple(f.name for f in dataclasses.fields(SampleConfig))


def run_folder(reader):
    """The run folder a checkpoint reader belongs to (RUN for RUN/checkpoints/step-* or RUN/phema/*), or None."""
    if reader.run is not None:
        return reader.run
    folder = reader.folder
    if folder is not None and folder.parent.name in ("checkpoints", "phema"):
        return folder.parent.parent
    return None


def step_of_folder(folder):
    """The training step a checkpoint (or post-hoc EMA) folder holds, from its name; None when it names none."""
    import re

    found = re.search(r"step-?(\d+)$", Path(folder).name)
    return int(found.group(1)) if found else None


def apply_recommended(args, cfg, release_cfg_scale: float) -> None:
    """Fill the sampling flags left unset from `cfg.sample` (a run's recommendation), then the release defaults.

    `args.ema_std` "none" asks for the checkpoint's own EMA whatever the run recommends; `--guide-scale 1`
    turns a recommended autoguidance off."""
    recommended = getattr(cfg, "sample", None)
    for key in RECOMMENDED:
        if getattr(args, key, None) is None and recommended is not None:
            setattr(args, key, getattr(recommended, key))
    if args.cfg_scale is None:
        args.cfg_scale = release_cfg_scale
    if isinstance(args.ema_std, str):
        args.ema_std = None if args.ema_std.lower() == "none" else _positive(args.ema_std, "--ema-std")
    # The values themselves were checked where they came from: the flags by `check_args`, the run's by its config.
    if args.guide is not None and args.guide_scale is None:
        raise ConfigError("--guide needs --guide-scale W, the autoguidance weight (e.g. 2.0; 1 turns it off)")
    if args.guide_scale is None or args.guide_scale == 1:
        args.guide, args.guide_scale = None, 1.0


def _positive(text, flag):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{flag} is {text!r}; it must be a positive sigma_rel such as 0.05, or none")
    return value


def ema_reader(reader, std):
    """The reader of the post-hoc EMA of sigma_rel `std` at `reader`'s step (None: `reader` itself), or a
    one-line error saying how to make it."""
    if std is None:
        return reader
    from dit_trainer import checkpoint
    from dit_trainer.phema import phema_folder

    run, step = run_folder(reader), step_of_folder(reader.folder) if reader.folder is not None else None
    if run is None or step is None:
        raise ConfigError(f"--ema-std {std:g} reads the post-hoc EMA of a training run, but {reader.path} is not a "
                          f"checkpoint of one; pass a run folder or one of its checkpoints/step-* folders")
    if reader.folder.parent.name == "phema":
        return reader  # already a reconstruction
    folder = phema_folder(run, std, step)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} does not exist: reconstruct it first with `dit ema {run} --std {std:g} "
                              f"--at {step}` (the run must have tracked train.phema_stds)")
    return checkpoint.open(folder)


def guide_path(spec, run, from_config: bool):
    """The checkpoint a guide spec names: a step number of run folder `run` (the main checkpoint's), or a path
    (a config's relative to the run folder, a flag's as typed)."""
    text = str(spec)
    if text.isdigit():
        if run is None:
            raise ConfigError(f"guide {text} names a step of the main checkpoint's run, but the main checkpoint "
                              f"belongs to no run folder; pass the guide's path")
        return run / "checkpoints" / f"step-{int(text):08d}"
    path = Path(text).expanduser()
    if from_config and not path.is_absolute() and run is not None:
        path = run / path
    return path


def _objective_identity(cfg) -> dict:
    """What makes the network's time input mean the same noise level and its output the same quantity."""
    if cfg.objective == "transport":
        return {"objective": "transport", "transport.path_type": cfg.transport.path_type,
                "transport.prediction": cfg.transport.prediction}
    return {"objective": cfg.objective, "diffusion.num_timesteps": cfg.diffusion.num_timesteps,
            "diffusion.noise_schedule": cfg.diffusion.noise_schedule,
            "diffusion.predict_xstart": cfg.diffusion.predict_xstart}


def check_guide_fits(guide_cfg, guide_model, cfg, model, named: str) -> None:
    """A one-line ConfigError naming the first way the guide does not fit the main model."""
    shape = lambda m: f"{m.in_channels}x{m.input_size}x{m.input_size}"  # noqa: E731
    if shape(guide_model) != shape(model):
        raise ConfigError(f"{named} takes {shape(guide_model)} inputs but the main model {shape(model)}; a guide must "
                          f"be a checkpoint of the same run or a run of the same latent shape, classes and objective")
    if guide_model.num_classes != model.num_classes:
        raise ConfigError(f"{named} has {guide_model.num_classes} classes but the main model {model.num_classes}; a "
                          f"guide must be trained on the same classes")
    mine, theirs = _objective_identity(cfg), _objective_identity(guide_cfg)
    differ = [k for k in mine if mine[k] != theirs.get(k)]
    if differ:
        k = differ[0]
        raise ConfigError(f"{named} was trained with {k} {theirs.get(k)!r} but the main model with {mine[k]!r}; a "
                          f"guide must share the main model's objective")
    # The VAE itself is not compared: converted and copied folders carry their own copy of the same one.
    if guide_cfg.data.scaling_factor != cfg.data.scaling_factor:
        raise ConfigError(f"{named} sees latents scaled by {guide_cfg.data.scaling_factor} but the main model by "
                          f"{cfg.data.scaling_factor}; a guide must share the latent space")
    from dit_trainer.vae.latent_stats import stats_of

    if stats_of(guide_cfg.data) != stats_of(cfg.data):
        raise ConfigError(f"{named} sees latents normalised by other per-channel statistics (data.latent_mean/std) "
                          f"than the main model; a guide must share the latent space")


def load_guide(spec, run, cfg, model, device, from_config: bool = False, key: str = "sample.guide"):
    """(guide model in eval mode on `device`, its reader) for guide spec `spec` of run folder `run` (the main
    model's, or None), checked against the main model; `key` names a config's spec in errors."""
    from dit_trainer import checkpoint
    from dit_trainer.sample.loading import load_model

    named = f"{key if from_config else '--guide'} {spec}"
    path = guide_path(spec, run, from_config)
    if not path.exists():
        raise CheckpointError(f"{named}: {path} does not exist; keep the guide's step with checkpoint.keep_steps, or "
                              f"pass an existing checkpoint or run folder")
    guide_reader = checkpoint.open(path, flag=named.split(" ")[0])
    if guide_reader.folder is None:
        raise ConfigError(f"{named} is a weights file; a guide must be a checkpoint or run folder (its config.yaml "
                          f"says which objective it was trained with)")
    guide_model, guide_cfg = load_model(guide_reader)
    check_guide_fits(guide_cfg, guide_model, cfg, model, named)
    return guide_model.to(device).requires_grad_(False), guide_reader
