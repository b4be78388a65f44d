"""The direction term on the velocity loss: 1 - cos(predicted, true velocity) per sample, in two forms.

The MSE of a velocity mixes its length and its direction; this term supervises the direction alone,
which FasterDiT (Yao et al., 2024) finds speeds training. It is added to the release's loss as w
times the term. The two forms measure the angle over different vectors:

- `flattened`: one cosine per sample, over the whole flattened sample (channels and positions
  together), the form this project has had from the start (FasterDiT's term as we read it);
- `per-position`: a cosine across the channels at each spatial position, then the mean over the
  positions, LightningDiT's form. On one-channel data each such cosine is only the sign of
  predicted times true velocity, whose gradient is zero: the term then teaches nothing.
"""

import math

import torch

from dit_trainer.errors import ConfigError

DIRECTION_FORMS = ("flattened", "per-position")


def check_direction_weight(weight, prediction) -> None:
    """One-line ConfigErrors for a negative or non-finite weight, or a set one on a non-velocity model."""
    if not (weight >= 0 and math.isfinite(weight)):
        raise ConfigError(f"transport.direction_loss_weight is {weight!r}; it must be 0 (off) or a positive number")
    if weight and prediction != "velocity":
        raise ConfigError(f"transport.direction_loss_weight applies to velocity prediction only, and "
                          f"transport.prediction is {prediction!r}; set it to 0 or use prediction velocity")


def check_direction_form(form) -> None:
    """A one-line ConfigError for a form that is not one of DIRECTION_FORMS."""
    if form not in DIRECTION_FORMS:
        raise ConfigError(f"transport.direction_loss_form {form!r} is not one of {', '.join(DIRECTION_FORMS)}")


def flattened_direction_loss(pred, target) -> torch.Tensor:
    """(B,) 1 - cosine similarity of each sample's prediction and target, each flattened whole."""
    return 1 - torch.nn.functional.cosine_similarity(pred.flatten(1), target.flatten(1), dim=1)


def per_position_direction_loss(pred, target) -> torch.Tensor:
    """(B,) 1 - the mean over positions of the cosine similarity across channels (dim 1) at each position."""
    cos = torch.nn.functional.cosine_similarity(pred, target, dim=1)
    return 1 - cos.flatten(1).mean(dim=1)


def direction_loss(pred, target, form="flattened") -> torch.Tensor:
    """(B,) the direction term of `form` (see DIRECTION_FORMS)."""
    check_direction_form(form)
    if form == "per-position":
        return per_position_direction_loss(pred, target)
    return flattened_direction_loss(pred, target)
