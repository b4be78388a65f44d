"""Training data: latent datasets in each supported layout, packed shards and VAE extraction,
and the digits for the demo. Heavy optional parts (diffusers, scikit-learn) load on first use."""

from dit_trainer.data.digits import DigitsDataset, classify_images, digits_classifier
from dit_trainer.data.extract import run_extract
from dit_trainer.data.images import center_crop_arr, list_image_folder
from dit_trainer.data.latents import FastDiTFeatures, NpyLatentFolder, open_latent_dataset
from dit_trainer.data.shards import LatentShards, ShardWriter, read_manifest, write_manifest
from dit_trainer.data.tools import convert, verify
from dit_trainer.data.vae import decode, encode, load_vae

__all__ = [
    "DigitsDataset", "classify_images", "digits_classifier", "center_crop_arr", "list_image_folder",
    "FastDiTFeatures", "NpyLatentFolder", "open_latent_dataset", "LatentShards", "ShardWriter",
    "read_manifest", "write_manifest", "convert", "verify", "decode", "encode", "load_vae", "run_extract",
]
