"""FasterDiT's direction term (Yao et al., 2024): 1 - cos(predicted, true velocity) per sample.

The MSE of a velocity mixes its length and its direction; this term supervises the direction alone,
which the paper finds speeds training. It is added to the release's loss as w times the term.
"""

import math

import torch

from dit_trainer.errors import ConfigError


def check_direction_weight(weight, prediction) -> None:
    """One-line ConfigErrors for a negative or non-finite weight, or a set one on a non-velocity model."""
    if not (weight >= 0 and math.isfinite(weight)):
        raise ConfigError(f"transport.direction_loss_weight is {weight!r}; it must be 0 (off) or a positive number")
    if weight and prediction != "velocity":
        raise ConfigError(f"transport.direction_loss_weight applies to velocity prediction only, and "
                          f"transport.prediction is {prediction!r}; set it to 0 or use prediction velocity")


def direction_loss(pred, target) -> torch.Tensor:
    """(B,) 1 - cosine similarity of each sample's prediction and target over all its other dims."""
    return 1 - torch.nn.functional.cosine_similarity(pred.flatten(1), target.flatten(1), dim=1)
