"""Training data: latent datasets in each supported layout, packed shards and latent extraction (through `dit_trainer.vae`),
and the digits for the demos (captioned by what they show for the text demo). Names load on first use (torch, diffusers and scikit-learn only
when needed), so registering `dit extract` and `dit data` does not import torch."""

from dit_trainer.lazy import lazy_exports

from dit_trainer.vae import DEFAULT_VAE  # noqa: F401 (found here by older code)

_LAZY = {
    "DigitsDataset": "digits", "classify_images": "digits", "digits_classifier": "digits",
    "CaptionedDigits": "digits_text", "digit_captions": "digit_attributes",
    "run_extract": "extract",
    "center_crop_arr": "images", "list_image_folder": "images",
    "FastDiTFeatures": "latents", "NpyLatentFolder": "latents", "open_latent_dataset": "latents",
    "LatentShards": "shards", "ShardWriter": "shards", "read_manifest": "shards", "write_manifest": "shards",
    "TextShards": "text_shards", "open_shards": "text_shards",
    "convert": "tools", "verify": "tools",
    "decode": "dit_trainer.vae.autoencoder", "encode": "dit_trainer.vae.autoencoder",
    "load_vae": "dit_trainer.vae.autoencoder",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = sorted([*_LAZY, "DEFAULT_VAE"])
