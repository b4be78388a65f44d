"""The DiT family's own model options (nanoGPT's `GPTConfig` is the model for this)."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class DiTConfig:
    """Size overrides of a named DiT; None keeps the paper's value for that name (e.g. DiT-S/2)."""

    depth: Optional[int] = None
    hidden_size: Optional[int] = None
    num_heads: Optional[int] = None
    mlp_ratio: Optional[float] = None
    # The timestep convention the weights were trained under: 0 / 1e-6 is the release's; an import
    # from diffusers records 1 / 1e-5 (its Timesteps(downscale_freq_shift=1) and norm_eps).
    timestep_freq_shift: Optional[int] = None
    mlp_norm_eps: Optional[float] = None
