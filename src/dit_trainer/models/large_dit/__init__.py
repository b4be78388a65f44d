"""Large-DiT (DiT-LLaMA) family: the model, its config, and its registry entries.

Each size is registered as `LargeDiT-<size>/2` and under the release's function name
(`DiT_Llama_<size>_patch2`). Size fields can be overridden from `cfg.model` (`dim`,
`n_layers`, `n_heads`, ...) to build small members of the family for tests and demos.
"""

import dataclasses

from dit_trainer.models.large_dit.config import LargeDiTConfig, large_dit_kwargs
from dit_trainer.models.large_dit.layers import swiglu_hidden
from dit_trainer.models.large_dit.model import DiT_Llama
from dit_trainer.models.spec import ModelSpec, register_spec

# (dim, n_layers, n_heads) of the release's three sizes, all with 2×2 patches.
SIZES = {"600M": (1536, 16, 32), "3B": (3072, 32, 32), "7B": (4096, 32, 32)}


def _constructor(size, patch=2):
    dim, n_layers, n_heads = SIZES[size]

    def build(**kwargs):
        return DiT_Llama(**{"patch_size": patch, "dim": dim, "n_layers": n_layers, "n_heads": n_heads, **kwargs})

    build.__name__ = f"DiT_Llama_{size}_patch{patch}"
    build.__doc__ = f"LargeDiT-{size}/{patch}: dim {dim}, {n_layers} layers, {n_heads} heads, patch {patch}."
    return build


DiT_Llama_models = {f"LargeDiT-{size}/2": _constructor(size) for size in SIZES}
DiT_Llama_600M_patch2 = DiT_Llama_models["LargeDiT-600M/2"]
DiT_Llama_3B_patch2 = DiT_Llama_models["LargeDiT-3B/2"]
DiT_Llama_7B_patch2 = DiT_Llama_models["LargeDiT-7B/2"]


def build_large_dit(cfg, size):
    """A DiT_Llama of `size` from a Config, a ModelConfig or a mapping (family keys override)."""
    dim, n_layers, n_heads = SIZES[size]
    return DiT_Llama(**large_dit_kwargs(cfg, {"patch_size": 2, "dim": dim, "n_layers": n_layers, "n_heads": n_heads}))


def _spec(name, size):
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    extra = {}
    # The redesigned ModelSpec carries the family and its config dataclass; pass them once it does.
    if "family" in fields:
        extra["family"] = "large_dit"
    if "config_cls" in fields:
        extra["config_cls"] = LargeDiTConfig
    return ModelSpec(name=name, build_model_fn=lambda cfg, size=size: build_large_dit(cfg, size), **extra)


def _register():
    for size in SIZES:
        spec = _spec(f"LargeDiT-{size}/2", size)
        register_spec(spec.name, spec)
        register_spec(f"DiT_Llama_{size}_patch2", spec)


_register()

__all__ = [
    "DiT_Llama",
    "DiT_Llama_models",
    "DiT_Llama_600M_patch2",
    "DiT_Llama_3B_patch2",
    "DiT_Llama_7B_patch2",
    "LargeDiTConfig",
    "SIZES",
    "build_large_dit",
    "swiglu_hidden",
]
