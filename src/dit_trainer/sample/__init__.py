"""Sampling: a trained model and its objective -> images (PNG grids, ADM `.npz` batches).

Depends on models, objectives, checkpoint reading and the VAE; never on the training package.
Names load on first use, so registering `dit sample` (this package's `cli`) does not import torch.
"""

from dit_trainer.lazy import lazy_exports

# Torch-free, and imported here so that `dit_trainer.sample.decode` is the function, not the module.
from dit_trainer.sample.decode import DEFAULT_VAE, decode, load_decoder, to_images, vae_source
from dit_trainer.sample.loading import load_model

_LAZY = {
    "add_commands": "cli", "run": "cli",
    "save_grid": "images", "save_npz": "images", "to_uint8": "images", "adm_images": "images",
    "from_adm_images": "images",
    "IMAGENET_DEMO_LABELS": "sampling", "as_objective": "sampling", "default_classes": "sampling",
    "guided_model_fn": "sampling", "has_null_class": "sampling", "sample_grid": "sampling",
    "sample_latents": "sampling",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = sorted([*_LAZY, "DEFAULT_VAE", "decode", "load_decoder", "to_images", "vae_source", "load_model"])
