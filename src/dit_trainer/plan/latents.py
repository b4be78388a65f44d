"""The latent shape `dit plan` prices: the one `dit train` would take from the data (the shards'
manifest) or its VAE's config, so an f16c32 or f32c32 autoencoder is priced at its own token count
and width rather than the SD VAE's 1/8 and 4 channels."""

import json
import os
from typing import Optional, Tuple

from dit_trainer.errors import ConfigError
from dit_trainer.vae.geometry import SD_FACTOR, downsampling


def _vae_geometry(vae) -> Optional[Tuple[int, int]]:
    """(channels, pixels per latent side) from a local VAE folder's config.json, or None."""
    if not vae:
        return None
    folder = os.path.expanduser(str(vae))
    for file in (os.path.join(folder, "config.json"), os.path.join(folder, "vae", "config.json")):
        if os.path.isfile(file):
            try:
                with open(file, encoding="utf-8") as f:
                    config = json.load(f)
                factor = downsampling(config)
                return None if factor is None else (int(config.get("latent_channels", 4)), factor)
            except (OSError, ValueError, TypeError):
                return None
    return None


def _data_geometry(cfg):
    """(channels, latent side, pixels per latent side, what says so) of cfg's data, or None where unknown."""
    path = cfg.data.path
    if path and path != "digits" and os.path.isfile(os.path.join(path, "manifest.json")):
        from dit_trainer.data.shards import read_manifest

        m = read_manifest(path)
        channels, side = int(m["latent_shape"][0]), int(m["latent_shape"][-1])
        factor = int(m["image_size"]) // side if m.get("image_size") else SD_FACTOR
        return channels, side, factor, os.path.join(path, "manifest.json")
    geometry = _vae_geometry(cfg.data.vae)
    if geometry is not None:
        return geometry[0], None, geometry[1], f"data.vae {cfg.data.vae}"
    return None


class PlanShapes:
    """`build_config(..., shapes=PlanShapes(image_size))`: model.in_channels and model.input_size from the
    latents (`--image-size` / the VAE's downsampling factor); a value the user set that contradicts
    them is a one-line error, as in `dit train`."""

    def __init__(self, image_size: Optional[int] = None):
        self.image_size = image_size

    def __call__(self, cfg, given: frozenset) -> None:
        geometry = _data_geometry(cfg)
        channels, side, factor, source = geometry if geometry else (None, None, SD_FACTOR, "the SD VAE")
        if self.image_size:
            if self.image_size % factor:
                raise ConfigError(f"--image-size {self.image_size} is not a multiple of {factor}, the pixels per latent "
                                  f"side of {source}; pick a multiple of {factor}")
            if side is not None and self.image_size // factor != side:
                raise ConfigError(f"--image-size {self.image_size} gives {self.image_size // factor}-wide latents but "
                                  f"{source} holds {side}-wide ones; leave --image-size out or plan other data")
            side = self.image_size // factor

        def take(key: str, value, what: str) -> None:
            name = key.split(".")[1]
            if value is None:
                return
            if key not in given:
                setattr(cfg.model, name, value)
            elif getattr(cfg.model, name) != value:
                raise ConfigError(f"{key} is {getattr(cfg.model, name)} but {source} makes {what}; set {key} to "
                                  f"{value} or leave it out")

        take("model.in_channels", channels, f"{channels}-channel latents")
        take("model.input_size", side, f"{side}x{side} latents" + (f" from {self.image_size} px images" if self.image_size else ""))
