"""`ppdiffusers`: the folder PaddleMIX's DiT converter writes and ppdiffusers' DiTPipeline loads
with a plain `from_pretrained(OUT)`.

`model_index.json` (with id2label, which ppdiffusers' own save_pretrained drops),
`scheduler/scheduler_config.json`, `transformer/config.json` + `model_state.pdparams`
(ppdiffusers 0.29 has no DiTTransformer2DModel: its DiT is `Transformer2DModel` with
`norm_type: ada_norm_zero`, under diffusers' tensor names), `vae/config.json` + `model_state.pdparams`.
Everything is written and read without paddle; linear weights are stored [in, out].
"""

from pathlib import Path

from dit_trainer.convert.model_bundle import Bundle
from dit_trainer.convert.hf_diffusers import (check_pos_embed, load_vae_model, model_index, pipeline_bundle,
                                              vae_latent_stats)
from dit_trainer.convert.diffusers_names import to_diffusers
from dit_trainer.convert.pdparams import load_pdparams, save_pdparams
from dit_trainer.convert.pipeline_folder import (model_from_transformer_config, read_json, scheduler_config,
                                                 transformer_config, transformer_dir, write_json)
from dit_trainer.errors import CheckpointError, ConfigError

WEIGHTS = "model_state.pdparams"
VERSION = "0.29.0"


def write(bundle: Bundle, out) -> Path:
    """Export `bundle` as a ppdiffusers DiTPipeline folder at `out`."""
    out = Path(out)
    tcfg = transformer_config(bundle.model, "Transformer2DModel")
    check_pos_embed(bundle)
    vae = load_vae_model(bundle)
    if type(vae).__name__ != "AutoencoderKL":
        raise ConfigError(f"ppdiffusers' DiTPipeline has no {type(vae).__name__}; export this model with --to diffusers")
    vae_cfg = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
    if bundle.scaling_factor is not None:
        vae_cfg["scaling_factor"] = float(bundle.scaling_factor)
    vae_cfg.update(vae_latent_stats(bundle, vae_cfg))
    write_json(out / "model_index.json", model_index(bundle, "ppdiffusers", "Transformer2DModel",
                                                    "_ppdiffusers_version", VERSION))
    write_json(out / "scheduler" / "scheduler_config.json",
               {**scheduler_config(bundle.diffusion), "_ppdiffusers_version": VERSION})
    write_json(out / "transformer" / "config.json", {**tcfg, "_ppdiffusers_version": VERSION})
    save_pdparams(to_diffusers(bundle.state_dict), out / "transformer" / WEIGHTS)
    write_json(out / "vae" / "config.json", {"_class_name": "AutoencoderKL", "_ppdiffusers_version": VERSION, **vae_cfg})
    save_pdparams(vae.state_dict(), out / "vae" / WEIGHTS)
    return out


def read(src, convention="diffusers") -> Bundle:
    """A Bundle from a ppdiffusers DiTPipeline folder; its VAE is rewritten as a diffusers folder
    in a temporary directory, which `run_folder.write` copies next to the weights."""
    root = Path(src)
    tdir = transformer_dir(src, "ppdiffusers")
    model = model_from_transformer_config(read_json(tdir / "config.json"), tdir / "config.json", convention)
    weights = tdir / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights} does not exist; is {root} a ppdiffusers DiTPipeline folder?")
    sd = load_pdparams(weights)
    vae = vae_to_diffusers(root / "vae") if (root / "vae" / WEIGHTS).is_file() else None
    return pipeline_bundle(root, tdir, model, sd, vae)


def vae_to_diffusers(vae_dir: Path) -> str:
    """A diffusers copy of a paddle-layout VAE folder, in a fresh temporary folder; returns its path."""
    import tempfile

    from safetensors.torch import save_file

    cfg = read_json(vae_dir / "config.json")
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    dest = Path(tempfile.mkdtemp(prefix="dit-vae-"))
    write_json(dest / "config.json", {"_class_name": "AutoencoderKL", **cfg})
    sd = {k: v.contiguous() for k, v in load_pdparams(vae_dir / WEIGHTS).items()}
    save_file(sd, str(dest / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    return str(dest)
