"""Frozen pretrained image encoders (DINOv2 ViT-S/B/L/g /14, with and without registers) for
representation alignment: `build_encoder(name, weights)` → Encoder with `encode(images, size)`."""

from dit_trainer.encoders.encoder import Encoder
from dit_trainer.encoders.flops import encoder_flops, encoder_param_bytes, encoder_param_count
from dit_trainer.encoders.layouts import hub_to_transformers, transformers_to_hub
from dit_trainer.encoders.preprocess import IMAGENET_MEAN, IMAGENET_STD, preprocess
from dit_trainer.encoders.registry import (REPA_POS_RESAMPLE, SPECS, build_encoder, encoder_names, hf_id,
                                           shape_of, torch_hub_url)
from dit_trainer.encoders.vit import VitShape

__all__ = [
    "Encoder", "VitShape", "build_encoder", "encoder_names", "shape_of", "SPECS", "REPA_POS_RESAMPLE",
    "hf_id", "torch_hub_url", "encoder_flops", "encoder_param_bytes", "encoder_param_count",
    "hub_to_transformers", "transformers_to_hub", "preprocess", "IMAGENET_MEAN", "IMAGENET_STD",
]
