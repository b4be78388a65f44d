"""Tiny random DINOv2 encoders of the real architectures, for the encoder tests."""

import math

import torch

from dit_trainer.encoders import build_encoder

TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 56}


def tiny_encoder(name="dinov2_vitb14", seed=0, **overrides):
    """A frozen tiny encoder `name` with every parameter random (layer scales and norms included), so that a
    wrong mapping of any tensor changes the outputs."""
    encoder = build_encoder(name, **{**TINY, **overrides})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in encoder.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise / math.sqrt(p[0].numel()) if p.dim() >= 2 and p.shape[0] != 1 else 1 + 0.3 * noise)
    return encoder


def images(batch=2, size=64, channels=3, seed=1):
    """Random float images in [0, 1]."""
    return torch.rand(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))
