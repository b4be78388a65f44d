"""build_encoder: a frozen DINOv2 encoder by name, random or with pretrained weights."""

from typing import Optional

import torch

from dit_trainer.encoders.encoder import Encoder
from dit_trainer.encoders.loading import load_weights
from dit_trainer.encoders.registry import shape_of


def build_encoder(name: str, weights: Optional[str] = None, device=None, dtype: Optional[torch.dtype] = None,
                  **overrides) -> Encoder:
    """A frozen, eval-mode DINOv2 encoder `name`: random init when `weights` is None, else loaded from a
    torch-hub .pth file, a transformers folder or a Hugging Face id in the local cache."""
    shape = shape_of(name, **overrides)
    encoder = Encoder(shape, name=name)
    if weights is not None:
        load_weights(encoder, weights)
    if device is not None or dtype is not None:
        encoder = encoder.to(device=device, dtype=dtype)
    return encoder
