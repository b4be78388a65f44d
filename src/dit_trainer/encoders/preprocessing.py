"""The encoder's input: images in [0, 1] normalised with ImageNet statistics and resized, as REPA does.

REPA (sihyun-yu/REPA, `preprocess_raw_image` for DINOv2) normalises first and then resizes with
plain bicubic interpolation (`F.interpolate(..., mode="bicubic")`: no antialiasing, no corner
alignment) to 224 px for 256 px images. Both steps are linear and bicubic weights sum to one, so
the order changes nothing but rounding; it is kept for bitwise agreement with REPA's targets.
"""

import torch
import torch.nn.functional as F

from dit_trainer.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def check_size(size: int, patch_size: int) -> None:
    """ConfigError unless `size` is a positive multiple of the encoder's patch size."""
    if not isinstance(size, int) or size <= 0 or size % patch_size:
        lower = max(patch_size, (int(size) // patch_size) * patch_size) if isinstance(size, (int, float)) else 224
        raise ConfigError(f"encoder input size {size!r} is not a positive multiple of the patch size {patch_size}; "
                          f"use e.g. {lower} ({lower // patch_size} patches per side)")


def preprocess(images: torch.Tensor, size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, 3, size, size) ImageNet-normalised input from images in [0, 1], (B, 3, H, W) or grayscale (B, 1, H, W)."""
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ConfigError(f"encoder images must be (B, 3, H, W) or (B, 1, H, W) in [0, 1], got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ConfigError(f"encoder images must be float in [0, 1], got {images.dtype}; divide uint8 images by 255")
    x = images.float()
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    x = (x - mean) / std
    if tuple(x.shape[-2:]) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bicubic")
    return x.to(dtype)
