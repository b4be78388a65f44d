"""The DINOv2 encoders by name: their sizes and where their weights are published."""

import dataclasses

from dit_trainer.encoders.shape import VitShape
from dit_trainer.errors import ConfigError

_SIZES = {  # letter: (embed_dim, depth, num_heads, swiglu, Hugging Face size word)
    "s": (384, 12, 6, False, "small"),
    "b": (768, 12, 12, False, "base"),
    "l": (1024, 24, 16, False, "large"),
    "g": (1536, 40, 24, True, "giant"),
}

TORCH_HUB_URL = "https://dl.fbaipublicfiles.com/dinov2"

# Position-embedding resampling as REPA does it (timm's resample_abs_pos_embed once at load: bicubic
# to the size, antialiased). Equal to dinov2's own convention for the _reg models; for the others pass
# these as overrides to build_encoder to reproduce REPA's targets exactly.
REPA_POS_RESAMPLE = {"interpolate_offset": 0.0, "interpolate_antialias": True}


def _shape(letter: str, registers: bool) -> VitShape:
    dim, depth, heads, swiglu, _ = _SIZES[letter]
    if registers:
        return VitShape(dim, depth, heads, swiglu=swiglu, num_register_tokens=4,
                        interpolate_offset=0.0, interpolate_antialias=True)
    return VitShape(dim, depth, heads, swiglu=swiglu)


SPECS = {f"dinov2_vit{letter}14{'_reg' if reg else ''}": _shape(letter, reg)
         for letter in _SIZES for reg in (False, True)}


def encoder_names() -> list:
    """The names build_encoder accepts."""
    return list(SPECS)


def shape_of(name: str, **overrides) -> VitShape:
    """The VitShape of encoder `name` with `overrides` (embed_dim, depth, num_heads, img_size, ...) applied."""
    if name not in SPECS:
        raise ConfigError(f"unknown encoder {name!r}; choose one of {', '.join(SPECS)}")
    fields = {f.name for f in dataclasses.fields(VitShape)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(f"unknown encoder override {unknown[0]!r}; valid ones: {', '.join(sorted(fields))}")
    shape = dataclasses.replace(SPECS[name], **overrides)
    if shape.embed_dim % shape.num_heads:
        raise ConfigError(f"encoder embed_dim {shape.embed_dim} is not divisible by num_heads {shape.num_heads}")
    if shape.img_size % shape.patch_size:
        raise ConfigError(f"encoder img_size {shape.img_size} is not a multiple of patch_size {shape.patch_size}")
    return shape


def torch_hub_file(name: str) -> str:
    """File name of the official torch-hub checkpoint of `name` (dinov2_vitb14_reg → dinov2_vitb14_reg4_pretrain.pth)."""
    base = name.removesuffix("_reg")
    return f"{base}_reg4_pretrain.pth" if name.endswith("_reg") else f"{base}_pretrain.pth"


def torch_hub_url(name: str) -> str:
    """Download address of the official torch-hub checkpoint of `name`."""
    return f"{TORCH_HUB_URL}/{name.removesuffix('_reg')}/{torch_hub_file(name)}"


def hf_id(name: str) -> str:
    """The Hugging Face id of `name` (facebook/dinov2-base, facebook/dinov2-with-registers-base, ...)."""
    letter = name.removesuffix("_reg")[len("dinov2_vit")]
    word = _SIZES[letter][4]
    return f"facebook/dinov2-with-registers-{word}" if name.endswith("_reg") else f"facebook/dinov2-{word}"
