"""The Large-DiT family's own model fields (the `model:` keys beyond those every family shares)."""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from dit_trainer.errors import ConfigError

# Fields of `cfg.model` that every family shares and that are also DiT_Llama arguments.
SHARED_KWARGS = ("input_size", "in_channels", "num_classes", "learn_sigma", "class_dropout_prob")
# Shared fields that are not constructor arguments (read by the registry, the trainer, sampling).
SHARED_OTHER = ("name", "weights_path")


@dataclass
class LargeDiTConfig:
    """Size and options of a DiT-LLaMA; the defaults are the release's 7B member."""

    patch_size: int = 2
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: Optional[int] = None  # None: as many kv heads as query heads (no GQA)
    multiple_of: int = 256  # SwiGLU hidden width is rounded up to a multiple of this
    ffn_dim_multiplier: Optional[float] = None
    norm_eps: float = 1e-5
    qk_norm: bool = False  # the release's bf16 recipe (its 7B checkpoint) turns this on

    def __post_init__(self):
        if self.dim % self.n_heads:
            raise ConfigError(f"model.dim {self.dim} is not divisible by model.n_heads {self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ConfigError(f"model.dim / model.n_heads = {self.dim // self.n_heads} must be even for RoPE")
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if kv < 1 or self.n_heads % kv:
            raise ConfigError(f"model.n_heads {self.n_heads} is not a multiple of model.n_kv_heads {kv}")


FAMILY_FIELDS = tuple(f.name for f in dataclasses.fields(LargeDiTConfig))


def _as_mapping(cfg) -> dict:
    if hasattr(cfg, "model") and not isinstance(cfg, Mapping):
        cfg = cfg.model
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = dataclasses.asdict(cfg)
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"cannot build a Large-DiT from {type(cfg).__name__}; pass a Config, ModelConfig or dict")
    return dict(cfg)


def large_dit_kwargs(cfg, defaults: Mapping) -> dict:
    """DiT_Llama arguments: a size's `defaults`, overridden by the non-None keys of `cfg.model`.

    A key that is neither shared nor a LargeDiTConfig field (a DiT `depth`, say) is an error,
    so a typo never silently trains the full-size model.
    """
    given = {k: v for k, v in _as_mapping(cfg).items() if v is not None}
    unknown = sorted(set(given) - set(SHARED_KWARGS) - set(SHARED_OTHER) - set(FAMILY_FIELDS))
    if unknown:
        raise ConfigError(
            f"model keys {unknown} are not Large-DiT fields; use {', '.join(FAMILY_FIELDS)}"
        )
    family = LargeDiTConfig(**{**defaults, **{k: given[k] for k in FAMILY_FIELDS if k in given}})
    shared = {k: given[k] for k in SHARED_KWARGS if k in given}
    return {**dataclasses.asdict(family), **shared}
