"""Small tensor helpers shared by the diffusion modules."""

import numpy as np
import torch

__all__ = ["extract_into_tensor", "mean_flat"]


def mean_flat(tensor):
    """Mean over every dimension except the batch dimension."""
    return tensor.mean(dim=list(range(1, tensor.dim())))


def extract_into_tensor(arr, timesteps, broadcast_shape):
    """Gather ``arr[timesteps]`` as float32 shaped ``[N, 1, ...]`` and broadcast to ``broadcast_shape``."""
    # Casting before indexing gives the same float32 values as the reference (index in float64,
    # then cast) while moving half the bytes and working on devices without float64.
    res = torch.from_numpy(np.asarray(arr)).float().to(device=timesteps.device)[timesteps]
    while res.dim() < len(broadcast_shape):
        res = res[..., None]
    # A materialised copy, not a view, so callers may modify the result in place.
    return res.expand(tuple(broadcast_shape)).contiguous()
