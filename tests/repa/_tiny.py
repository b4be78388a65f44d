"""REPA settings small enough for tests: a random-weight DINOv2-shaped encoder of one block."""

from tests.train.trainer_helpers import with_sections

TINY_ENCODER = {"embed_dim": 16, "depth": 1, "num_heads": 2, "img_size": 56}
# encoder_depth 1: the release's block 8 is past these models' few blocks.
TINY_REPA = {"enabled": True, "projector_dim": 32, "encoder_weights": "random", "encoder_overrides": TINY_ENCODER,
             "encoder_depth": 1}


def digits_config(out, steps=10, **sections):
    """A tiny SiT on the 8x8 digits (4x4 tokens, encoder input 56 px) with REPA on."""
    cfg = {
        "output_dir": str(out),
        "model": {"name": "SiT-S/2", "depth": 2, "hidden_size": 32, "num_heads": 2},
        "data": {"path": "digits", "num_workers": 0, "digits_size": 8},
        "train": {"global_batch_size": 16, "max_steps": steps, "device": "cpu", "mixed_precision": "fp32"},
        "optim": {"lr": 1e-3},
        "checkpoint": {"save_steps": 1000},
        "logging": {"log_steps": 1, "progress": False, "tensorboard": False},
        "repa": dict(TINY_REPA),
    }
    return with_sections(cfg, sections)
