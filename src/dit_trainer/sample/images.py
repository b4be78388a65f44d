"""Images to files: PNG grids and ADM-style `.npz` batches (the one format of every `.npz` of samples:
`arr_0` uint8 N×H×W×3, `arr_1` int64 labels)."""

import math
import os
from pathlib import Path

import numpy as np
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.fs import staged_file


def to_uint8(images) -> np.ndarray:
    """uint8 N×H×W×C from float N×C×H×W images in [-1, 1] (uint8 arrays pass through as N×H×W×C)."""
    if isinstance(images, np.ndarray) and images.dtype == np.uint8:
        return images if images.ndim == 4 else images[None]
    x = torch.as_tensor(images).detach().cpu()
    if x.dim() == 3:
        x = x.unsqueeze(0)
    if x.dtype != torch.uint8:
        x = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).contiguous().numpy()


def adm_images(images) -> np.ndarray:
    """The ADM evaluator's images: uint8 N×H×W×3 from float N×C×H×W in [-1, 1] or uint8 N×H×W×C;
    one-channel images are repeated into RGB, since the FID networks read three channels."""
    arr = to_uint8(images)
    return np.repeat(arr, 3, axis=-1) if arr.shape[-1] == 1 else arr


def from_adm_images(arr: np.ndarray, channels: int = 3) -> np.ndarray:
    """float32 N×`channels`×H×W in [-1, 1] from ADM uint8 N×H×W×3 (channels=1 keeps the first, for gray images)."""
    return np.ascontiguousarray(arr[..., :channels].transpose(0, 3, 1, 2)).astype(np.float32) / 127.5 - 1


def save_grid(images, path, nrow=8, padding=2):
    """Write images as one PNG, `nrow` per row with black `padding` (torchvision's make_grid layout)."""
    from PIL import Image

    arr = to_uint8(images)
    n, h, w, c = arr.shape
    if c not in (1, 3):
        raise ConfigError(f"cannot save {c}-channel images; decode latents through their VAE first")
    cols = max(1, min(int(nrow), n))
    rows = math.ceil(n / cols)
    grid = np.zeros((rows * (h + padding) + padding, cols * (w + padding) + padding, c), dtype=np.uint8)
    for i, img in enumerate(arr):
        top, left = padding + (i // cols) * (h + padding), padding + (i % cols) * (w + padding)
        grid[top:top + h, left:left + w] = img
    path = Path(path)
    # Under a temporary name, renamed when whole: an interrupted write leaves the old picture, not half a new one.
    fmt = Image.registered_extensions().get(path.suffix.lower())
    with staged_file(path, ConfigError) as tmp:
        # Grayscale stays single-channel ("L"): the digits demo's classifier reads it back as such.
        Image.fromarray(grid[..., 0] if c == 1 else grid).save(tmp, format=fmt)
    return path


def save_npz(path, images, labels, settings=None, extra=None):
    """Write arr_0 (`adm_images(images)`), arr_1 (labels), if given `settings` (as a JSON string) and the
    arrays of `extra`, to `path` atomically; returns the path."""
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    extra = {**({"settings": np.array(json.dumps(settings))} if settings is not None else {}), **(extra or {})}
    with open(tmp, "wb") as f:  # a file object keeps numpy from appending ".npz" to the name
        np.savez(f, arr_0=adm_images(images), arr_1=np.asarray(labels).astype(np.int64), **extra)
    os.replace(tmp, path)
    return path
