"""The frozen VAE between images and latents, below both `data` (which encodes with it) and
`sample` (which decodes with it). Names load on first use, so reading `DEFAULT_VAE` (as `dit --help`
does) imports neither torch nor diffusers."""

from dit_trainer.lazy import lazy_exports

# The VAE `dit extract` and `dit train` encode images with unless told another (--vae, data.vae).
DEFAULT_VAE = "stabilityai/sd-vae-ft-mse"

_LAZY = {name: "autoencoder" for name in ("decode", "encode", "latent_shape", "load_vae", "looks_like_path",
                                         "resolve_dtype", "scaling")}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = sorted([*_LAZY, "DEFAULT_VAE"])
