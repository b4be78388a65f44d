"""Frozen pretrained image encoders (DINOv2 ViT-S/B/L/g /14, with and without registers) for
representation alignment: `build_encoder(name, weights)` → Encoder with `encode(images, size)`.
Names load on first use: the sizes and costs (`registry`, `costs`) are torch-free, for the planner."""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "build_encoder": "build",
    "Encoder": "encoder",
    "encoder_flops": "costs", "encoder_param_bytes": "costs", "encoder_param_count": "costs",
    "hub_to_transformers": "layouts", "transformers_to_hub": "layouts",
    "IMAGENET_MEAN": "preprocessing", "IMAGENET_STD": "preprocessing", "preprocess": "preprocessing",
    "REPA_POS_RESAMPLE": "registry", "SPECS": "registry", "encoder_names": "registry", "hf_id": "registry",
    "shape_of": "registry", "torch_hub_url": "registry",
    "VitShape": "shape",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
