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
