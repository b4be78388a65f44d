"""Run a feature network over uint8 images in batches: pool, spatial and logits per image.

A feature network is any `nn.Module` whose forward takes float N×3×H×W images in 0..255 (what
the ADM evaluator feeds its graph) and returns {"pool": N×D, "spatial": N×S, "logits": N×C}.
`FIDInceptionV3` and `DigitFeatureNet` are the two shipped; tests plug in small random ones.
"""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from dit_trainer.errors import ConfigError

DTYPES = {"fp32": None, "bf16": torch.bfloat16}
FIELDS = ("pool", "spatial", "logits")


@dataclass
class Features:
    """Per-image features as float32 arrays: pool N×D, spatial N×S, logits N×C."""

    pool: np.ndarray
    spatial: np.ndarray
    logits: np.ndarray

    def __len__(self) -> int:
        return len(self.pool)


def _batches(images, batch_size: int):
    if isinstance(images, np.ndarray) or torch.is_tensor(images):
        for start in range(0, len(images), batch_size):
            yield images[start:start + batch_size]
    else:
        yield from images


def iter_features(network, images, batch_size: int = 64, dtype: str = "fp32", device="cpu",
                  progress: bool = True, total: Optional[int] = None, desc: str = "features"):
    """Yield a Features per batch of uint8 N×H×W×3 images (an array, or an iterable of batches)."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch size must be a positive integer, got {batch_size!r}")
    device = torch.device(device)
    network = network.to(device).eval()
    amp = DTYPES[dtype]
    if total is None and hasattr(images, "__len__"):
        total = len(images)
    from dit_trainer.progress import progress_bar

    with progress_bar(total=total, desc=desc, unit="img", disable=not progress) as bar:
        for batch in _batches(images, batch_size):
            x = torch.as_tensor(np.asarray(batch))
            if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
                raise ConfigError(f"expected uint8 N×H×W×3 image batches, got {x.dtype} {tuple(x.shape)}")
            x = x.to(device).permute(0, 3, 1, 2).float()
            with torch.no_grad(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                feats = network(x)
            # Statistics are taken in float64 later; bf16 features are widened, not kept.
            yield Features(*(feats[k].float().cpu().numpy() for k in FIELDS))
            bar.update(len(x))


def extract_features(network, images, batch_size: int = 64, dtype: str = "fp32", device="cpu",
                     progress: bool = True, total: Optional[int] = None, desc: str = "features") -> Features:
    """Features of all images, concatenated (see iter_features)."""
    if total is None and hasattr(images, "__len__"):
        total = len(images)
    parts, out, filled = [], None, 0
    for f in iter_features(network, images, batch_size, dtype, device, progress, total, desc):
        if out is None and not parts and total is not None:
            # Filled in place when the count is known: a small array kept per batch between the
            # batches' large transient ones would fragment the heap, which evaluation keeps
            # untrimmed on a CPU (host_memory.py), so its size would grow with the sample count.
            out = Features(*(np.empty((total, *getattr(f, k).shape[1:]), np.float32) for k in FIELDS))
        if out is not None and not parts and filled + len(f) <= total:
            for k in FIELDS:
                getattr(out, k)[filled:filled + len(f)] = getattr(f, k)
            filled += len(f)
        else:
            parts.append(f)  # more images than `total` said: the rest are concatenated
    if out is not None:
        parts.insert(0, Features(*(getattr(out, k)[:filled] for k in FIELDS)))
    if not parts:
        raise ConfigError("no images to measure")
    if len(parts) == 1:
        return parts[0]
    return Features(*(np.concatenate([getattr(f, k) for f in parts]) for k in FIELDS))
