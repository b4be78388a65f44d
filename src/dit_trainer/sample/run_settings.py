"""The checkpoints a run's sampling settings name besides the main one, found before any model loads.

The post-hoc EMA an `ema_std` names (`RUN/phema/stdS-stepN`) and the autoguidance guide a guide spec names
(`config.guide_spec`: a step, a share of the main checkpoint's step, a post-hoc EMA at such a share, or a
folder) are located by `locate`; a post-hoc EMA folder that is missing (or older than the snapshots it was
made from) while the run holds the snapshot of its step is rebuilt by `rebuild_missing`, on rank 0 while
the others wait, exactly as `dit ema` writes it, and kept. A guide that does not fit the main model is
refused in one line (`check_guide_fits`).
"""

import dataclasses
import re
from pathlib import Path
from typing import Optional

from dit_trainer.errors import CheckpointError, ConfigError, DitError


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
    found = re.search(r"step-?(\d+)$", Path(folder).name)
    return int(found.group(1)) if found else None


@dataclasses.dataclass(frozen=True)
class Located:
    """Where a SampleSettings' checkpoints are: the main model's, the guide's (or None), and the post-hoc EMA
    folders among them to rebuild first, as (run folder, sigma_rel, step)."""

    main: Path
    guide: Optional[Path] = None
    rebuild: tuple = ()


def locate(settings, reader, key: Optional[str] = None) -> Located:
    """The checkpoints `settings` samples from, `reader` the main checkpoint as named; a one-line error for one
    that is neither there nor can be rebuilt. `key` names the guide spec in errors (default: where it came from)."""
    rebuild = []
    main = reader.path
    if settings.ema_std is not None:
        main, todo = _main_ema(reader, settings.ema_std)
        rebuild += todo
    guide = None
    if settings.guide is not None:
        guide, todo = guide_location(settings.guide, reader, key or settings.guide_origin)
        rebuild += todo
    return Located(Path(main), guide, tuple(rebuild))


def _main_ema(reader, std):
    """(folder, rebuilds) of the post-hoc EMA of sigma_rel `std` at `reader`'s step."""
    run, step = run_folder(reader), step_of_folder(reader.folder) if reader.folder is not None else None
    if run is None or step is None:
        raise ConfigError(f"--ema-std {std:g} reads the post-hoc EMA of a training run, but {reader.path} is not a "
                          f"checkpoint of one; pass a run folder or one of its checkpoints/step-* folders")
    if reader.folder.parent.name == "phema":
        return reader.folder, []  # already a reconstruction
    return _posthoc(run, std, step, f"--ema-std {std:g}")


def _posthoc(run, std, step, named):
    """(folder, rebuilds) of the post-hoc EMA of `std` at `step` of `run`: used when it is there and up to date,
    rebuilt from the snapshot of `step` otherwise."""
    from dit_trainer.phema import phema_folder
    from dit_trainer.phema.posthoc import rebuildable, up_to_date

    folder = phema_folder(run, std, step)
    if folder.is_dir() and up_to_date(folder, run):
        return folder, []
    if rebuildable(run, step):
        return folder, [(Path(run), float(std), int(step))]
    if folder.is_dir():
        return folder, []  # its snapshots are gone (or it was copied in): used as it is
    raise CheckpointError(f"{named}: {folder} does not exist, and {run} holds no post-hoc EMA snapshot of step {step} "
                          f"to rebuild it from (`dit ema {run} --std {std:g} --at {step}` needs one; the run must "
                          f"have tracked train.phema_stds)")


def guide_location(text, reader, key: str):
    """(checkpoint folder, rebuilds) of guide spec `text` (`config.guide_spec`), `reader` the main checkpoint;
    `key` names the spec (`--guide`, `sample.guide`, `eval.guide`): a config's folder is relative to the run."""
    from dit_trainer.config.guide_spec import nearest_step, parse_guide, step_at
    from dit_trainer.phema import list_snapshots

    spec = parse_guide(text, key)
    named = f"{key} {spec.text}"
    run = run_folder(reader)
    if spec.of_run and run is None:
        raise ConfigError(f"{named} names a checkpoint of the main checkpoint's run, but {reader.path} belongs to no "
                          f"run folder; pass the guide's path")
    main_step = step_of_folder(reader.folder) if reader.folder is not None else None
    if spec.share is not None and main_step is None:
        raise ConfigError(f"{named} is a share of the main checkpoint's step, but {reader.path} names no step; pass "
                          f"one of the run's checkpoints/step-* folders")
    if spec.std is not None:
        at = nearest_step(spec.share, main_step, [s for s, _ in list_snapshots(run)])
        if at is None:
            raise CheckpointError(f"{named}: {run}/phema holds no post-hoc EMA snapshot up to step {main_step} to "
                                  f"rebuild the guide from; train with train.phema_stds set, or name another guide")
        return _posthoc(run, spec.std, at, named)
    if spec.path is None:
        step = spec.step if spec.step is not None else step_at(spec.share, main_step)
        path = Path(run) / "checkpoints" / f"step-{step:08d}"
    else:
        path = Path(spec.path).expanduser()
        if key != "--guide" and not path.is_absolute() and run is not None:
            path = Path(run) / path
        rebuilt = _named_posthoc(path, run, named)
        if rebuilt is not None:
            return rebuilt
    if not path.exists():
        raise CheckpointError(f"{named}: {path} does not exist; keep the guide's step with checkpoint.keep_steps, or "
                              f"pass an existing checkpoint or run folder")
    return path, []


def _named_posthoc(path, run, named):
    """(folder, rebuilds) when `path` is a post-hoc EMA folder of `run` by name (RUN/phema/stdS-stepN), else None."""
    found = re.match(r"^std([0-9.]+)-step(\d{8})$", path.name)
    if run is None or found is None or path.parent.resolve() != (Path(run) / "phema").resolve():
        return None
    from dit_trainer.phema import phema_folder

    std, step = float(found.group(1)), int(found.group(2))
    if phema_folder(run, std, step).name != path.name or (path.exists() and not path.is_dir()):
        return None
    return _posthoc(run, std, step, named)


def rebuild_missing(located, ranks=None) -> None:
    """Rebuild every post-hoc EMA folder `located` (Located values) lists, each once, as `dit ema` writes it:
    on rank 0 of `ranks` (a `fid_batch.Ranks`; None: this process alone) while the others wait; a failure
    there is the same one-line error on every rank."""
    from dit_trainer.sample.fid_batch import ONE_PROCESS

    ranks = ranks or ONE_PROCESS
    # Rank 0's list for every rank: another rank may look after rank 0 has rebuilt a folder, see nothing to do
    # and skip the collective below.
    todo = ranks.from_rank0(list(dict.fromkeys(item for place in located for item in place.rebuild)))
    if not todo:
        return
    failed = None
    if ranks.rank == 0:
        import sys

        from dit_trainer.phema import reconstruct

        try:
            for run, std, step in todo:
                folder = reconstruct(run, [std], at_step=step)[0]
                print(f"rebuilt the post-hoc EMA {folder} from the run's snapshots (as dit ema does)", file=sys.stderr)
        except DitError as err:
            failed = str(err)
    failed = ranks.from_rank0(failed)
    if failed:
        raise CheckpointError(failed)


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
    conditioned = lambda m: (tuple(getattr(m, "condition_keys", ("y",))), getattr(m, "caption_channels", None))  # noqa: E731
    if conditioned(guide_model) != conditioned(model):
        (keys, width), (main_keys, main_width) = conditioned(guide_model), conditioned(model)
        raise ConfigError(f"{named} takes {', '.join(keys)}{f' ({width} wide)' if width else ''} but the main model "
                          f"{', '.join(main_keys)}{f' ({main_width} wide)' if main_width else ''}; a guide must be "
                          f"conditioned as the main model is (the same text encoder's captions)")
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


def load_guide(path, cfg, model, device, named: str = "--guide"):
    """(guide model in eval mode on `device`, its reader) of checkpoint folder `path` (what `locate` found),
    checked against the main model; `named` says where the guide was named, in errors."""
    from dit_trainer import checkpoint
    from dit_trainer.sample.loading import load_model

    guide_reader = checkpoint.open(path, flag=named.split(" ")[0])
    if guide_reader.folder is None:
        raise ConfigError(f"{named} is a weights file; a guide must be a checkpoint or run folder (its config.yaml "
                          f"says which objective it was trained with)")
    guide_model, guide_cfg = load_model(guide_reader)
    check_guide_fits(guide_cfg, guide_model, cfg, model, named)
    return guide_model.to(device).requires_grad_(False), guide_reader
