"""The DiT family's own model options (nanoGPT's `GPTConfig` is the model for this)."""

import math
import re
from dataclasses import dataclass
from typing import Optional

from dit_trainer.errors import ConfigError

_NAME = re.compile(r"-(XL|L|B|S)/(\d+)$")
# The block options' values, the release's first (`model.norm`, `model.mlp`).
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
# The release's block: what every format beside ours (diffusers, ppdiffusers, dit-pt, MindSpore) holds.
RELEASE_BLOCK = {"norm": "layernorm", "mlp": "gelu", "rope": False, "qk_norm": False}


@dataclass
class DiTConfig:
    """Size overrides of a named DiT; None keeps the paper's value for that name (e.g. DiT-S/2)."""

    depth: Optional[int] = None  # transformer blocks (default: the named size's)
    hidden_size: Optional[int] = None  # token width, a multiple of 4 (default: the named size's)
    num_heads: Optional[int] = None  # attention heads, must divide hidden_size (default: the named size's)
    mlp_ratio: Optional[float] = None  # MLP width / hidden_size (default: 4)
    # The timestep convention the weights were trained under: None keeps the release's (0, 1e-6);
    # an import from diffusers records 1 and 1e-5 (its Timesteps(downscale_freq_shift=1), norm_eps).
    timestep_freq_shift: Optional[int] = None  # 1: timestep frequencies over half - 1 (diffusers' DiT)
    mlp_norm_eps: Optional[float] = None  # eps of the norm before each MLP (diffusers' DiT: 1e-5)
    # Block options of LightningDiT's kind; the defaults are the release's block.
    norm: str = "layernorm"  # layernorm | rmsnorm: the block's and final layer's norms (rmsnorm: a learned scale)
    mlp: str = "gelu"  # gelu | swiglu: SwiGLU without biases, 2/3 of the GELU MLP's width (int(2/3 * int(hidden * mlp_ratio)))
    rope: bool = False  # 2-D axial rotary embedding on q and k (the sin-cos pos_embed stays); head width a multiple of 4
    qk_norm: bool = False  # RMSNorm on each head of q and of k, before RoPE

    def check(self, name: str, model) -> None:
        """One-line ConfigError for sizes the model `name` cannot be built with (input size from `model`)."""
        for key in ("depth", "hidden_size", "num_heads", "mlp_ratio"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ConfigError(f"model.{key} is {value!r}; it must be a positive number")
        for key, known in (("norm", NORMS), ("mlp", MLPS)):
            if getattr(self, key) not in known:
                raise ConfigError(f"model.{key} is {getattr(self, key)!r}; use one of {', '.join(known)}")
        match = _NAME.search(str(name))
        if match is None:  # a name registered by another family on this backbone: sizes unknown
            return
        # Imported here: the MindSpore backend reads this file alone, without the models package.
        from dit_trainer.models.dit.sizes import SIZES

        depth, hidden, heads = SIZES[match.group(1)]
        patch = int(match.group(2))
        hidden = self.hidden_size or hidden
        heads = self.num_heads or heads
        if hidden % 4:
            # The fixed 2-D sin-cos position table gives each grid axis half the width, as sin and cos.
            step = math.lcm(4, heads)
            sizes = [s for s in (hidden - hidden % step, hidden - hidden % step + step) if s > 0]
            raise ConfigError(f"model.hidden_size {hidden} of {name} is not a multiple of 4, which the 2-D sin-cos "
                              f"position embedding needs; use {' or '.join(map(str, sizes))}")
        if hidden % heads:
            near = sorted(sorted((d for d in range(1, hidden + 1) if hidden % d == 0), key=lambda d: abs(d - heads))[:3])
            raise ConfigError(
                f"model.num_heads {heads} does not divide model.hidden_size {hidden} of {name}; "
                f"use {', '.join(map(str, near))} heads or another hidden_size"
            )
        if self.rope and (hidden // heads) % 4:
            raise ConfigError(f"model.rope needs a head width (model.hidden_size / model.num_heads = {hidden} / {heads}) "
                              f"that is a multiple of 4, for two rotated pairs per grid axis; change either, or set "
                              f"model.rope false")
        size = getattr(model, "input_size", None)
        if size is not None and size % patch:
            raise ConfigError(
                f"model.input_size {size} is not divisible by the patch size {patch} of {name}; use an input size "
                f"that is a multiple of {patch} (image size / 8 for VAE latents) or a model with a smaller patch"
            )


def block_options(model) -> dict:
    """The block options of a model section (a mapping, family options flattened) that are not the release's."""
    return {k: model[k] for k, v in RELEASE_BLOCK.items() if model.get(k) is not None and model[k] != v}


def refuse_block_options(found: dict, fmt: str, source="the model",
                         advice="keep it in our format (a run folder, --to ours) and sample it with dit sample") -> None:
    """One-line ConfigError naming the block options in `found` (option -> value) that `fmt` cannot hold."""
    if found:
        named = ", ".join(f"model.{k} {str(v).lower()}" for k, v in found.items())
        raise ConfigError(f"{source} uses {named}, but {fmt} has only the release's DiT block; {advice}")
