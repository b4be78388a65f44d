"""Per-channel latent statistics: what `dit extract` measures, training divides out and sampling puts back.

The SD VAEs' `scaling_factor` (0.18215) was calibrated so their latents have about unit variance;
other autoencoders (VA-VAE's f16c32, DC-AE's f32c32) have channels of very different means and
spreads, and a model trained on them as they are learns badly (FID > 100). So for those, training
sees z' = (z - mean_c) / std_c, where z are the stored latents (already scaled and shifted by the
VAE config's factors) and mean_c, std_c their per-channel statistics over the data set; sampling
maps the model's output back with z = z' · std_c + mean_c before the VAE decodes it.

The statistics describe what training reads: for a stored posterior (mean m, std s) the sample
m + s·eps has E[z] = E[m] and E[z²] = E[m² + s²], so both are summed exactly without drawing
noise; both horizontal flips count when both were encoded. Sums are float64 per shard, kept in the
shard's marker and merged in shard order, so any number of ranks and any resume give the same
numbers.
"""

import math
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

# data.latent_norm: auto (what the shards record: channel for VAEs other than the 4-channel KL ones) |
# channel (per-channel statistics) | scale (the VAE's scaling_factor alone, the SD VAEs' way).
NORMS = ("auto", "channel", "scale")


def auto_norm(vae) -> str:
    """What `dit extract` records for a VAE: 'scale' for the 4-channel AutoencoderKLs (SD, SDXL) whose
    scaling_factor makes unit variance, 'channel' for every other autoencoder."""
    from dit_trainer.vae.geometry import has_posterior

    return "scale" if has_posterior(vae.config) and int(vae.config.latent_channels) == 4 else "channel"


def channel_sums(rows: np.ndarray) -> Dict:
    """{'n', 'sum', 'sumsq'} per channel of stored rows N×F×K×C×H×W (K = 2: posterior mean and std)."""
    n, flips, kinds, channels = rows.shape[:4]
    # float16's square is exact in float32 (11-bit mantissas, 22-bit products), so only the sums need float64.
    wide = np.float32 if rows.dtype == np.float16 else np.float64
    total, squares = [], []
    for c in range(channels):  # one channel at a time: wide copies of a whole shard would be large
        square = 0.0
        for k in range(kinds):
            x = rows[:, :, k, c].astype(wide)
            if k == 0:
                total.append(float(x.sum(dtype=np.float64)))
            square += float(np.square(x, out=x).sum(dtype=np.float64))
        squares.append(square)
    return {"n": int(n * flips * int(np.prod(rows.shape[4:]))), "sum": total, "sumsq": squares}


def merge(parts: Iterable[Dict]) -> Optional[Tuple[List[float], List[float]]]:
    """(mean, std) per channel from `channel_sums` parts, in the order given; None when they hold nothing."""
    n, total, squares = 0, None, None
    for part in parts:
        if not part["n"]:
            continue
        n += part["n"]
        total = list(part["sum"]) if total is None else [a + b for a, b in zip(total, part["sum"])]
        squares = list(part["sumsq"]) if squares is None else [a + b for a, b in zip(squares, part["sumsq"])]
    if not n:
        return None
    mean = [t / n for t in total]
    std = [math.sqrt(max(q / n - m * m, 0.0)) for q, m in zip(squares, mean)]
    return mean, std


def check_stats(mean, std, channels: int, where: str, error) -> None:
    """`error` (a DitError class) in one line unless mean and std are `channels` finite numbers, std > 0."""
    for name, values in (("latent_mean", mean), ("latent_std", std)):
        if not isinstance(values, (list, tuple)) or len(values) != channels or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise error(f"{where}: {name} must list {channels} finite numbers (one per latent channel), got "
                        f"{values!r}; re-run `dit extract` or set data.{name}")
    if not all(v > 0 for v in std):
        raise error(f"{where}: latent_std holds a value <= 0 ({std!r}); a channel that never varies cannot be "
                    "normalised, re-run `dit extract` or set data.latent_std")


def stats_of(data) -> Optional[Tuple[List[float], List[float]]]:
    """(mean, std) a run's data section (a DataConfig, or a dict read from a config.yaml) normalises
    with, or None (the latents are used as stored)."""
    get = data.get if isinstance(data, dict) else lambda key, default=None: getattr(data, key, default)
    if get("latent_norm", "auto") == "scale" or get("latent_mean") is None:
        return None
    return list(get("latent_mean")), list(get("latent_std") or [])


def same_stats(a, b) -> bool:
    """Whether two `stats_of` results normalise alike (to float rounding: YAML and JSON round trips)."""
    if a is None or b is None:
        return a is None and b is None
    return all(len(x) == len(y) and all(math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-12) for u, v in zip(x, y))
               for x, y in zip(a, b))


def describe_stats(stats) -> str:
    """`stats_of`'s result in a few words, for one-line errors."""
    if stats is None:
        return "as stored (no per-channel statistics)"
    short = lambda v: "[" + ", ".join(f"{x:.6g}" for x in v[:3]) + (", ...]" if len(v) > 3 else "]")  # noqa: E731
    return f"with per-channel mean {short(stats[0])} and std {short(stats[1])}"


def device_stats(data, device):
    """`stats_of(data)` as float32 1×C×1×1 tensors on `device` (made once, not per batch), or None."""
    stats = stats_of(data)
    if stats is None:
        return None
    import torch

    return tuple(torch.tensor(v, dtype=torch.float32, device=device).view(1, -1, 1, 1) for v in stats)


def fold(stats, scaling_factor: float, shift_factor) -> tuple:
    """(factor, shift), float32 tensors of C, with z / factor + shift = (z · std + mean) / scaling_factor
    + shift_factor: the VAE's decode of normalised latents as a per-channel scale and shift."""
    import torch

    mean, std = (torch.tensor(v, dtype=torch.float64) for v in stats)
    sf, shift = float(scaling_factor), float(shift_factor or 0.0)
    return (sf / std).float(), (mean / sf + shift).float()


def _view(values, x):
    import torch

    return torch.as_tensor(values, dtype=x.dtype, device=x.device).view(1, -1, *([1] * (x.dim() - 2)))


def normalize(x, stats):
    """(x - mean) / std per channel (dim 1); `x` itself when `stats` is None."""
    if stats is None:
        return x
    return (x - _view(stats[0], x)) / _view(stats[1], x)


def denormalize(x, stats):
    """x · std + mean per channel (dim 1), the inverse of `normalize`; `x` itself when `stats` is None."""
    if stats is None:
        return x
    return x * _view(stats[1], x) + _view(stats[0], x)
