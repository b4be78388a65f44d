"""`diffusers`: a folder `diffusers.DiTPipeline.from_pretrained` loads (a PixArt's: `pixart_pipeline`).

`model_index.json` (with id2label), `transformer/` (DiTTransformer2DModel config.json and
diffusion_pytorch_model.safetensors), `scheduler/` (DDIM, linear 1e-4 -> 0.02) and `vae/`.
The weights map exactly; diffusers' timestep embedding divides its frequencies by 127 where DiT
divides by 128, so an exported model computes a slightly different function (see docs/convert.md).
"""

import contextlib
from pathlib import Path

import torch

from dit_trainer.convert.model_bundle import Bundle
from dit_trainer.convert.diffusers_names import from_diffusers, to_diffusers
from dit_trainer.convert.model_config import check_fits, fixed_pos_embed
from dit_trainer.convert.pipeline_folder import (class_names_from, diffusion_from_scheduler, id2label,
                                                 model_from_transformer_config, read_json, scheduler_config,
                                                 transformer_config, transformer_dir, write_json)
from dit_trainer.errors import CheckpointError, ConfigError

WEIGHTS = "diffusion_pytorch_model.safetensors"
VERSION = "0.30.0"  # the oldest diffusers with DiTTransformer2DModel


# An fp32 EMA, ema <- d*ema + (1-d)*c, stops moving toward a constant c once (1-d)*|c - ema| is under
# half an ulp of ema: it can stay up to ulp/(2(1-d)) away, 6e-4 at DiT's d = 0.9999 for values <= 1
# (the sin-cos table's range). A table of another grid or width differs by O(0.1-1), so 1e-3 tells
# EMA rounding from a different table; a half-precision file adds its own rounding (eps).
POS_EMBED_ATOL = 1e-3


def check_pos_embed(bundle: Bundle) -> None:
    """Refuse weights whose position table is not DiT's fixed one: the pipeline formats recompute it.
    EMA rounding noise (within POS_EMBED_ATOL) is accepted; the exported model uses the exact table."""
    ref = fixed_pos_embed(bundle.model)
    stored = bundle.state_dict["pos_embed"]
    if tuple(stored.shape) != tuple(ref.shape):
        raise CheckpointError(f"{bundle.source}: pos_embed is {tuple(stored.shape)}, DiT's fixed sin-cos table is "
                              f"{tuple(ref.shape)}; it cannot be exported")
    atol = POS_EMBED_ATOL + (torch.finfo(stored.dtype).eps if stored.is_floating_point() else 0.0)
    diff = float((stored.to(ref.dtype) - ref).abs().max())
    if not diff <= atol:  # NaN refused too
        raise CheckpointError(f"{bundle.source}: pos_embed differs from DiT's fixed sin-cos table by up to {diff:.3g} "
                              f"(more than EMA rounding, {atol:.3g}); diffusers recomputes that table instead of "
                              "storing it, so these weights cannot be exported")


def model_index(bundle: Bundle, library: str, transformer_class: str, version_key: str, version: str,
                vae_class: str = "AutoencoderKL") -> dict:
    """model_index.json of a DiTPipeline folder."""
    return {"_class_name": "DiTPipeline", version_key: version,
            "id2label": id2label(bundle.class_names, int(bundle.model.get("num_classes", 1000))),
            "scheduler": [library, "DDIMScheduler"], "transformer": [library, transformer_class],
            "vae": [library, vae_class]}


def vae_latent_stats(bundle: Bundle, vae_config) -> dict:
    """The VAE config's `latents_mean`/`latents_std` for `bundle`, in diffusers' (SDXL's) convention, where a
    pipeline decodes z · latents_std / scaling_factor + latents_mean: mean / scaling_factor and std of our
    per-channel statistics; None for a model of unnormalised latents where the config has the keys, so no
    pipeline applies statistics the model was not trained with."""
    if bundle.latent_mean is None:
        return {k: None for k in ("latents_mean", "latents_std") if vae_config.get(k) is not None}
    sf = float(bundle.scaling_factor or vae_config.get("scaling_factor") or 0.18215)
    return {"latents_mean": [float(m) / sf for m in bundle.latent_mean],
            "latents_std": [float(s) for s in bundle.latent_std]}


def bundle_latent_stats(vae_config: dict, scaling_factor) -> dict:
    """`Bundle` fields (latent_mean, latent_std) from a pipeline VAE config's latents_mean/std (the inverse of
    `vae_latent_stats`); empty where the config has none."""
    mean, std = vae_config.get("latents_mean"), vae_config.get("latents_std")
    if mean is None or std is None:
        return {}
    sf = float(scaling_factor or 0.18215)
    return {"latent_mean": [float(m) * sf for m in mean], "latent_std": [float(s) for s in std]}


@contextlib.contextmanager
def quiet_diffusers():
    """diffusers' warnings off for our own loads, its logging level restored after: without `accelerate`
    installed, every model load prints a 6-line notice to install it, which changes nothing here."""
    from diffusers.utils import logging as diffusers_logging

    level = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        yield
    finally:
        diffusers_logging.set_verbosity(level)


def load_vae_model(bundle: Bundle, pipeline: str = "DiTPipeline"):
    """The autoencoder of `bundle`'s latents, for a pipeline folder's vae/ (data.vae's loader: one-line
    errors, an offline Hub id fails fast); refused when its latents are not what the model takes."""
    channels = int(bundle.model.get("in_channels", 4))
    if not bundle.vae:
        raise ConfigError(f"{bundle.source} records no VAE, and a {pipeline} decodes latents with the one the model "
                          f"was trained with: pass --vae DIR_OR_ID (a model trained on pixels, like the digits demo, "
                          f"has no {pipeline} form; sample it with dit sample)")
    from dit_trainer.vae.autoencoder import load_vae

    with quiet_diffusers():
        vae = load_vae(bundle.vae)
    latent = int(vae.config.latent_channels)
    if latent != channels:
        raise ConfigError(f"--vae {bundle.vae} makes {latent}-channel latents but the model takes {channels} channels; "
                          f"pass the VAE it was trained with (a pixel model has no {pipeline} form)")
    return vae


def write(bundle: Bundle, out) -> Path:
    """Export `bundle` as a diffusers DiTPipeline folder at `out`."""
    from safetensors.torch import save_file

    out = Path(out)
    tcfg = transformer_config(bundle.model, "DiTTransformer2DModel")
    check_pos_embed(bundle)
    vae = load_vae_model(bundle)
    if bundle.scaling_factor is not None:
        vae.register_to_config(scaling_factor=float(bundle.scaling_factor))  # what the pipeline divides by
    vae.register_to_config(**vae_latent_stats(bundle, dict(vae.config)))
    write_json(out / "model_index.json", model_index(bundle, "diffusers", "DiTTransformer2DModel",
                                                    "_diffusers_version", VERSION, type(vae).__name__))
    write_json(out / "scheduler" / "scheduler_config.json", {**scheduler_config(bundle.diffusion), "_diffusers_version": VERSION})
    write_json(out / "transformer" / "config.json", {**tcfg, "_diffusers_version": VERSION})
    # diffusers' per-block embedder copies are one tensor here; safetensors wants each stored once.
    state = {k: v.detach().contiguous().clone() for k, v in to_diffusers(bundle.state_dict).items()}
    save_file(state, str(out / "transformer" / WEIGHTS), metadata={"format": "pt"})
    vae.save_pretrained(str(out / "vae"), safe_serialization=True)
    return out


def transformer_tensors(root, tdir) -> dict:
    """The tensors of a pipeline's transformer folder `tdir` (every .safetensors file), in diffusers' names."""
    from dit_trainer.checkpoint.files import load_safetensors

    files = sorted(Path(tdir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{tdir} holds no .safetensors weights; re-save the pipeline with safe_serialization=True")
    sd = {}
    for f in files:
        try:
            sd.update(load_safetensors(f))
        except CheckpointError as err:  # truncated or garbled: one line, and what to do
            raise CheckpointError(f"{err}; download or save {root} again") from None
    return sd


def read(src, convention="diffusers") -> Bundle:
    """A Bundle from a diffusers DiTPipeline folder (or its transformer/ folder alone)."""
    root = Path(src)
    tdir = transformer_dir(src, "diffusers")
    tcfg = read_json(tdir / "config.json")
    model = model_from_transformer_config(tcfg, tdir / "config.json", convention)
    sd = transformer_tensors(root, tdir)
    vae_dir = root / "vae"
    return pipeline_bundle(root, tdir, model, sd, str(vae_dir) if vae_dir.is_dir() else None)


def pipeline_bundle(root, tdir, model, sd, vae) -> Bundle:
    """A Bundle from a pipeline folder's parts: transformer tensors in diffusers' names (torch layout)."""
    ours = from_diffusers(sd, fixed_pos_embed(model), source=str(tdir))
    check_fits(ours, model, tdir)
    index = read_json(root / "model_index.json") if (root / "model_index.json").is_file() else {}
    sched = root / "scheduler" / "scheduler_config.json"
    diffusion = diffusion_from_scheduler(read_json(sched), sched) if sched.is_file() else None
    vae_cfg = root / "vae" / "config.json"
    config = read_json(vae_cfg) if vae_cfg.is_file() else {}
    scaling = config.get("scaling_factor", 0.18215) if vae_cfg.is_file() else None
    return Bundle(state_dict=ours, model=model, vae=vae, **bundle_latent_stats(config, scaling),
                  scaling_factor=scaling, class_names=class_names_from(index, int(model["num_classes"])),
                  diffusion=diffusion or {"num_timesteps": 1000, "noise_schedule": "linear"}, source=str(root))
