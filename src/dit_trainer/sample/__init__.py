"""Sampling: a trained model and its objective -> images (PNG grids, ADM `.npz` batches).

Depends on models, objectives, checkpoint reading and the VAE; never on the training package.
"""

from dit_trainer.sample.cli import add_commands, run
from dit_trainer.sample.decode import DEFAULT_VAE, decode, load_decoder, to_images, vae_source
from dit_trainer.sample.images import save_grid, save_npz, to_uint8
from dit_trainer.sample.loading import load_model
from dit_trainer.sample.sampling import (
    IMAGENET_DEMO_LABELS,
    as_objective,
    default_classes,
    guided_model_fn,
    has_null_class,
    sample_grid,
    sample_latents,
    sample_npz,
)

__all__ = [
    "DEFAULT_VAE", "IMAGENET_DEMO_LABELS", "add_commands", "as_objective", "decode", "default_classes",
    "guided_model_fn", "has_null_class", "load_decoder", "load_model", "run", "sample_grid", "sample_latents",
    "sample_npz", "save_grid", "save_npz", "to_images", "to_uint8", "vae_source",
]
