"""The Large-DiT family's own model options (the `model:` keys beyond those every family shares)."""

from dataclasses import dataclass
from typing import Optional

from dit_trainer.errors import ConfigError
from dit_trainer.models.large_dit.sizes import SIZES


@dataclass
class LargeDiTConfig:
    """Options of a DiT-LLaMA. Size fields left None keep the named size's value (LargeDiT-7B/2:
    dim 4096, 32 layers, 32 heads); the rest default to the release's values."""

    dim: Optional[int] = None  # token width (default: the named size's)
    n_layers: Optional[int] = None  # transformer layers (default: the named size's)
    n_heads: Optional[int] = None  # query heads; dim / n_heads must be even (default: the named size's)
    n_kv_heads: Optional[int] = None  # key/value heads, dividing n_heads; None: as many as query heads (no GQA)
    multiple_of: int = 256  # SwiGLU hidden width is rounded up to a multiple of this
    ffn_dim_multiplier: Optional[float] = None  # scales the SwiGLU hidden width (8/3 x dim) before rounding; None: 1
    norm_eps: float = 1e-5  # eps of the RMSNorms
    qk_norm: bool = False  # normalise queries and keys; the release's bf16 recipe (its 7B checkpoint) turns this on
    patch_size: int = 2  # side of the latent patch one token covers; input_size must be a multiple of it

    def check(self, name: str, model) -> None:
        """One-line ConfigErrors for sizes the model `name` cannot be built with (input size from `model`),
        at config validation rather than as a traceback from building it."""
        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "multiple_of", "ffn_dim_multiplier", "patch_size"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ConfigError(f"model.{key} is {value!r}; it must be a positive number")
        size = str(name).removeprefix("LargeDiT-").split("/")[0]
        if size in SIZES:
            dim, _, n_heads = SIZES[size]
            check_sizes(self.dim or dim, self.n_heads or n_heads, self.n_kv_heads)
        input_size = getattr(model, "input_size", None)
        if input_size is not None and input_size % self.patch_size:
            raise ConfigError(f"model.input_size {input_size} is not divisible by model.patch_size {self.patch_size} "
                              f"of {name}; use an input size that is a multiple of it (image size / 8 for VAE latents)")


def check_sizes(dim: int, n_heads: int, n_kv_heads: Optional[int]) -> None:
    """One-line ConfigErrors for head counts the attention cannot split."""
    if dim % n_heads:
        raise ConfigError(f"model.dim {dim} is not divisible by model.n_heads {n_heads}")
    if (dim // n_heads) % 2:
        raise ConfigError(f"model.dim / model.n_heads = {dim // n_heads} must be even for rotary embeddings")
    kv = n_heads if n_kv_heads is None else n_kv_heads
    if kv < 1 or n_heads % kv:
        raise ConfigError(f"model.n_heads {n_heads} is not a multiple of model.n_kv_heads {kv}")
