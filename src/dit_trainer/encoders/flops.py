"""What the frozen encoder costs: forward FLOPs per image and the bytes of its parameters, for `dit plan`
and the MFU log.

Counted as models/flops.py counts the denoiser (2 FLOPs per multiply-add of every matmul, attention's
QKᵀ and AV at 2·2·T²·D per block) but forward only: the encoder runs under no_grad. T counts the class
and register tokens with the patches.
"""

from typing import Union

import torch
import torch.nn as nn

from dit_trainer.encoders.registry import shape_of
from dit_trainer.encoders.vit import DinoViT


def _as_model(encoder: Union[nn.Module, str]) -> nn.Module:
    if isinstance(encoder, str):
        # Built on the meta device: the sizes without allocating ViT-g's billion parameters.
        with torch.device("meta"):
            return DinoViT(shape_of(encoder))
    return encoder


def encoder_flops(encoder: Union[nn.Module, str], size: int) -> float:
    """Forward FLOPs of one size×size image through `encoder` (an Encoder or an encoder name)."""
    model = _as_model(encoder)
    patches = (size // model.patch_size) ** 2
    tokens = patches + 1 + model.num_register_tokens
    embed = model.patch_embed.proj.weight.numel()
    per_token = sum(m.weight.numel() for m in model.blocks.modules() if isinstance(m, nn.Linear))
    attention = 4 * tokens * tokens * model.embed_dim * len(model.blocks)
    return float(2 * embed * patches + 2 * per_token * tokens + attention)


def encoder_param_count(encoder: Union[nn.Module, str]) -> int:
    """Parameters of `encoder` (an Encoder or an encoder name)."""
    return sum(p.numel() for p in _as_model(encoder).parameters())


def encoder_param_bytes(encoder: Union[nn.Module, str], dtype: torch.dtype = None) -> int:
    """Bytes of `encoder`'s parameters, in `dtype` when given, else in the dtype they have (fp32 for a name)."""
    model = _as_model(encoder)
    if dtype is not None:
        return encoder_param_count(model) * torch.empty((), dtype=dtype).element_size()
    return sum(p.numel() * p.element_size() for p in model.parameters())
