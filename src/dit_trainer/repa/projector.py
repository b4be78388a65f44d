"""The model's side of REPA: the projector MLP on the aligned block's tokens, and the alignment loss.

The projector is a submodule of the model (`model.repa_projector`, attached by `repa.attach`), so
the optimizer, the EMA, checkpoints and FSDP treat it like any other weight; exports and sampling
drop it (`attach.PROJECTOR` names its keys). Its layout and initialisation are the REPA release's
`build_mlp` in SiT.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def build_projector(hidden_size: int, width: int, out_dim: int) -> nn.Sequential:
    """Linear -> SiLU -> Linear -> SiLU -> Linear (REPA's `build_mlp`), Xavier weights and zero biases."""
    mlp = nn.Sequential(nn.Linear(hidden_size, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
                        nn.Linear(width, out_dim))
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    return mlp


def alignment_loss(projected: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,) per-image REPA loss: the mean over tokens of -cos(projected, target); its batch mean is
    the release's `proj_loss`."""
    cos = (F.normalize(projected.float(), dim=-1) * F.normalize(target.float(), dim=-1)).sum(dim=-1)
    return -cos.mean(dim=-1)
