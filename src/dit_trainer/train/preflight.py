"""Checks before step 1 that would otherwise fail minutes into a run, with a step's checkpoint
unwritten: the output folder is the run's own and can be written, and the sample grids can be decoded."""

import importlib.util
import os
from pathlib import Path

from dit_trainer.errors import CheckpointError, ConfigError


def make_dir(*parts) -> Path:
    """The folder `parts` joined, created if missing."""
    p = Path(*[str(x) for x in parts])
    p.mkdir(parents=True, exist_ok=True)
    return p


def check_writable(output_dir) -> None:
    """A one-line error naming output_dir when it cannot be created or written."""
    try:
        probe = make_dir(output_dir) / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"output_dir {output_dir} is not writable ({err.strerror or err}); "
                              "pick another output_dir or fix its permissions") from None


def check_output_dir(output_dir) -> None:
    """A one-line error when output_dir is the current folder or holds it: the run's config.yaml,
    metrics.jsonl and checkpoints would land among (and over) the user's own files there."""
    out, here = Path(output_dir).resolve(), Path.cwd().resolve()
    if out == here or out in here.parents:
        raise CheckpointError(
            f"output_dir {output_dir} is the current folder{'' if out == here else ' or holds it'}: the run would "
            "write config.yaml, metrics.jsonl and checkpoints/ among your own files; pass a folder of its own, "
            "e.g. --output_dir outputs/run")


def check_grid_vae(cfg) -> None:
    """A one-line ConfigError when the sample grids need a VAE folder that does not exist or
    diffusers is missing; a Hub id is checked when it is loaded."""
    if not cfg.logging.image_steps:
        return
    from dit_trainer.vae.autoencoder import looks_like_path
    from dit_trainer.sample.decode import data_manifest, vae_source

    source = vae_source(cfg)
    if source is None:
        return  # pixels, or latents previewed without a VAE
    name = source[0]
    from_manifest = (data_manifest(cfg.data.path) or {}).get("vae") == name
    where = f" (recorded in {os.path.join(str(cfg.data.path), 'manifest.json')})" if from_manifest else ""
    if not os.path.isdir(os.path.expanduser(name)) and looks_like_path(name):
        raise ConfigError(
            f"data.vae {name}{where} does not exist, and logging.image_steps {cfg.logging.image_steps} decodes "
            f"sample grids with it; set data.vae to the VAE folder or Hub id the latents came from, or "
            f"logging.image_steps 0")
    if importlib.util.find_spec("diffusers") is None:
        raise ConfigError(f"logging.image_steps {cfg.logging.image_steps} decodes sample grids with the VAE "
                          f"{name}{where}, which needs diffusers (the vae extra); install it or set logging.image_steps 0")


def check_layout(cfg, dims) -> None:
    """One-line ConfigErrors for a batch, timestep sampler or token routing this parallel layout cannot split."""
    if (dims.tp_enabled or dims.pp_enabled) and cfg.diffusion.timestep_sampler == "loss-second-moment" and cfg.objective == "diffusion":
        # Its loss history gathers every rank's batch: TP/PP peers would count samples twice.
        raise ConfigError("diffusion.timestep_sampler loss-second-moment is not supported with parallel.tp/pp > 1; use uniform")
    if cfg.objective == "meanflow" and cfg.meanflow.jvp == "graph" and dims.ddp_enabled:
        # Measured on torch 2.13: the first step trains, the second fails in the reducer's bucket rebuild.
        raise ConfigError("meanflow.jvp graph does not run under DDP (parallel.dp_replicate > 1 without shards): its "
                          "second step fails; use meanflow.jvp separate, or FSDP (parallel.dp_shard)")
    local = dims.local_batch_size(cfg.train.global_batch_size)
    if local % cfg.train.grad_accum_steps:  # checked before the run folder is touched
        raise ConfigError(f"per-rank batch {local} is not divisible by train.grad_accum_steps {cfg.train.grad_accum_steps}")
    if dims.pp_enabled:
        from dit_trainer.models import get_spec

        spec = get_spec(cfg.model.name)
        if spec.pipelining_fn is None:  # before any model is built or process group touched
            raise ConfigError(f"model {spec.name} cannot be pipelined (its family has no stage split); set parallel.pp 1 "
                              "and shard it with parallel.dp_shard or parallel.tp instead")
        if cfg.train.routing_keep < 1:
            raise ConfigError("train.routing_keep < 1 (token routing) does not run with parallel.pp > 1: its span of "
                              "blocks would cross the stages; set parallel.pp 1 or train.routing_keep 1")
        if cfg.train.grad_accum_steps > 1:
            raise ConfigError("train.grad_accum_steps > 1 with parallel.pp > 1: raise parallel.pp_microbatches instead")
        if local % cfg.parallel.pp_microbatches:
            raise ConfigError(f"the per-rank batch {local} does not split into parallel.pp_microbatches "
                              f"{cfg.parallel.pp_microbatches}; pick a divisor of {local}")
