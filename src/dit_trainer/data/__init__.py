"""Training data: latent datasets in each supported layout, packed shards and VAE extraction,
and the digits for the demo. Names load on first use (torch, diffusers and scikit-learn only
when needed), so registering `dit extract` and `dit data` does not import torch."""

import importlib

_LAZY = {
    "DigitsDataset": "digits", "classify_images": "digits", "digits_classifier": "digits",
    "run_extract": "extract",
    "center_crop_arr": "images", "list_image_folder": "images",
    "FastDiTFeatures": "latents", "NpyLatentFolder": "latents", "open_latent_dataset": "latents",
    "LatentShards": "shards", "ShardWriter": "shards", "read_manifest": "shards", "write_manifest": "shards",
    "convert": "tools", "verify": "tools",
    "decode": "vae", "encode": "vae", "load_vae": "vae",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"dit_trainer.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dit_trainer.data' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
