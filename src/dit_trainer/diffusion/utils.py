"""Small tensor helpers shared by the diffusion modules."""

import numpy as np
import torch

__all__ = ["extract_into_tensor", "mean_flat"]


def mean_flat(tensor):
    """Mean over every dimension except the batch dimension."""
    return tensor.mean(dim=list(range(1, tensor.dim())))


# (id, device) -> (array, float32 copy on the device). A schedule's arrays are read every step;
# copying one from host memory each time makes the host wait for the device (a pageable copy).
# The entry keeps its array alive, so an id cannot be reused while it is cached.
_DEVICE_COPIES: dict = {}


def _on_device(arr, device) -> torch.Tensor:
    if not isinstance(arr, np.ndarray):
        return torch.from_numpy(np.asarray(arr)).float().to(device=device)
    key = (id(arr), str(device))
    hit = _DEVICE_COPIES.get(key)
    if hit is None or hit[0] is not arr:
        if len(_DEVICE_COPIES) > 512:
            _DEVICE_COPIES.clear()
        hit = _DEVICE_COPIES[key] = (arr, torch.from_numpy(arr).float().to(device=device))
    return hit[1]


def extract_into_tensor(arr, timesteps, broadcast_shape):
    """Gather ``arr[timesteps]`` as float32 shaped ``[N, 1, ...]`` and broadcast to ``broadcast_shape``."""
    # Casting before indexing gives the same float32 values as the reference (index in float64,
    # then cast) while moving half the bytes and working on devices without float64.
    res = _on_device(arr, timesteps.device)[timesteps]
    while res.dim() < len(broadcast_shape):
        res = res[..., None]
    # A materialised copy, not a view, so callers may modify the result in place.
    return res.expand(tuple(broadcast_shape)).contiguous()
