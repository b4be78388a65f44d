"""Format converters: released DiT checkpoints, our runs, diffusers and ppdiffusers pipelines.

`convert(src_format, src, dst_format, out, model=None, vae=None)` reads any format into a
`Bundle` (our tensor names + model config + VAE + class names, or a text model's text encoder) and
writes it in another. diffusers takes DiT (DiTPipeline) and PixArt (PixArtAlphaPipeline,
PixArtSigmaPipeline).
"""

from dit_trainer.config.paddlemix_json import is_paddlemix_config, load_paddlemix_json, model_config_from_paddlemix
from dit_trainer.convert.model_bundle import Bundle

READERS = ("dit-pt", "ours", "diffusers", "ppdiffusers")
WRITERS = ("ours", "diffusers", "ppdiffusers")


def read(fmt, src, model=None, vae=None, num_heads=None, convention="diffusers", text_encoder=None) -> Bundle:
    """A Bundle from `src` in format `fmt`; `vae` and `text_encoder` override what `src` records."""
    bundle = _read(fmt, src, model, vae, num_heads, convention)
    if text_encoder:
        bundle.text_encoder = str(text_encoder)
    return bundle


def _read(fmt, src, model, vae, num_heads, convention) -> Bundle:
    from dit_trainer.errors import ConfigError

    if fmt == "dit-pt":
        from dit_trainer.convert import dit_pt

        return dit_pt.read(src, model, num_heads, vae)
    if fmt == "ours":
        from dit_trainer.convert import run_folder

        return run_folder.read(src, model, vae)
    if fmt in ("diffusers", "ppdiffusers"):
        from dit_trainer.convert import hf_diffusers, pixart_pipeline, ppdiffusers_fmt

        if fmt == "diffusers" and pixart_pipeline.is_pixart_folder(src):
            bundle = pixart_pipeline.read(src)
        else:
            bundle = (hf_diffusers if fmt == "diffusers" else ppdiffusers_fmt).read(src, convention)
        if vae:
            bundle.vae = vae
        return bundle
    raise ConfigError(f"--from {fmt}: not one of {', '.join(READERS)}")


def write(fmt, bundle: Bundle, out, overwrite: bool = False):
    """Write `bundle` at `out` in format `fmt`; returns the path. The folder is written beside `out` and
    renamed into place; an `out` holding files is refused unless `overwrite` (then it is replaced)."""
    from pathlib import Path

    from dit_trainer.errors import ConfigError
    from dit_trainer.fs import refuse_existing, staged_folder

    if fmt == "ours":
        from dit_trainer.convert import run_folder as mod
    elif fmt == "diffusers":
        from dit_trainer.convert import hf_diffusers, pixart_pipeline

        mod = pixart_pipeline if pixart_pipeline.is_pixart(bundle.model) else hf_diffusers
    elif fmt == "ppdiffusers":
        from dit_trainer.convert import ppdiffusers_fmt as mod
    else:
        raise ConfigError(f"--to {fmt}: not one of {', '.join(WRITERS)} (dit-pt is read only)")
    if fmt != "ours" and bundle.transport is not None:
        # Their DiTPipeline samples a noise-prediction model with DDIM; a velocity model would come out as noise.
        raise ConfigError(f"{bundle.source} was trained with objective transport (SiT's interpolants), which "
                          f"{fmt}' pipelines (noise prediction, DDIM) cannot sample; use dit sample or "
                          f"dit_trainer's pipeline on it")
    if not overwrite:
        refuse_existing(out, "OUT", ConfigError)
    with staged_folder(out, replace=overwrite) as tmp:
        # Our config.yaml records paths under the folder's final name, not the staging one.
        mod.write(bundle, tmp, **({"final": out} if fmt == "ours" else {}))
    return Path(out)


def convert(src_format, src, dst_format, out, model=None, vae=None, num_heads=None, convention="diffusers",
            overwrite: bool = False, text_encoder=None):
    """Read `src` as `src_format` and write it to `out` as `dst_format`; returns (out, bundle)."""
    bundle = read(src_format, src, model=model, vae=vae, num_heads=num_heads, convention=convention,
                  text_encoder=text_encoder)
    return write(dst_format, bundle, out, overwrite), bundle


def add_commands(subparsers) -> None:
    """Register `dit convert` (dit_trainer.cli looks for this hook in this package)."""
    from dit_trainer.convert.cli import add_commands as add

    add(subparsers)


__all__ = ["Bundle", "add_commands", "READERS", "WRITERS", "convert", "read", "write", "is_paddlemix_config",
           "load_paddlemix_json", "model_config_from_paddlemix"]
