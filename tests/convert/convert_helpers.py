"""Helpers of the converter tests (a unique module name, so no other folder's helper shadows it)."""

import torch

# DiT-S/2's family at a toy size: 8x8 latents, 2 blocks, hidden 64, 2 heads, 10 classes.
TINY = {"name": "DiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10, "learn_sigma": True,
        "class_dropout_prob": 0.1, "depth": 2, "hidden_size": 64, "num_heads": 2}
CLASS_NAMES = [f"thing {i}, alias {i}" for i in range(10)]


def randomize(model, seed=0, std=0.1):
    """Random values in every trained tensor (DiT's init zeroes adaLN and the head, hiding mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "pos_embed":
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def build_with_convention(cfg):
    """Our model for a model-config dict, honouring its recorded timestep convention."""
    from dit_trainer.convert.model_config import build_dit

    return build_dit(cfg)
