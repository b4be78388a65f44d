"""Our DiT model config from what a converted file tells: its tensors, a diffusers config, a
PaddleMIX JSON. Every reader hands back a plain dict with `ModelConfig`'s field names
(`name`, `input_size`, `in_channels`, `num_classes`, `learn_sigma`, `class_dropout_prob`, and the
size overrides `depth`, `hidden_size`, `num_heads`, `mlp_ratio` only where the name's size differs),
plus the timestep convention of the weights when it is not the release's.
"""

import re

from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.models.dit.sizes import (  # noqa: F401 (the converters' names for them)
    CONVENTION_KEYS,
    DIFFUSERS_CONVENTION,
    PATCHES,
    RELEASE_CONVENTION,
    SIZES,
    dit_name,
    model_config,
    release_size,
)
from dit_trainer.models.dit.weights_shape import tensor_shape  # noqa: F401 (read off the tensors by the model family)


def shape_of(cfg: dict) -> dict:
    """depth, hidden_size, num_heads, patch_size, mlp_ratio of a model-config dict (name + overrides)."""
    m = re.fullmatch(r"DiT-(S|B|L|XL)/(\d+)", str(cfg.get("name", "")))
    if not m:
        raise ConfigError(f"model {cfg.get('name')!r} is not a DiT size name like DiT-XL/2; only DiT converts to this format")
    depth, hidden, heads = SIZES[m.group(1)]
    return {"depth": int(cfg.get("depth") or depth), "hidden_size": int(cfg.get("hidden_size") or hidden),
            "num_heads": int(cfg.get("num_heads") or heads), "patch_size": int(m.group(2)),
            "mlp_ratio": float(cfg.get("mlp_ratio") or 4.0)}


def convention_of(cfg: dict) -> dict:
    """The timestep convention a model-config dict records (the release's when it records none)."""
    return {k: cfg.get(k, v) for k, v in RELEASE_CONVENTION.items()}


def infer_from_state_dict(sd: dict, source="weights", num_heads=None) -> dict:
    """Model config of a DiT state dict (release names) read off its tensor shapes; the head count is
    the release size's, else `num_heads` (no tensor holds it, and a wrong one computes another function)."""
    shape = tensor_shape(sd, source)
    depth, hidden = shape["depth"], shape["hidden_size"]
    size = release_size(depth, hidden)
    heads = num_heads or (SIZES[size][2] if size else None)
    if heads is None:
        example = f", e.g. {hidden // 64} for 64-wide heads" if hidden % 64 == 0 else ""
        raise CheckpointError(f"{source}: a DiT of depth {depth} and hidden size {hidden} is no release size and its "
                              f"head count is not in the tensors; pass the model's own as --num-heads{example}, "
                              f"or --model with its model JSON")
    if hidden % int(heads):
        raise CheckpointError(f"{source}: --num-heads {heads} does not divide the hidden size {hidden}")
    return model_config(depth, hidden, int(heads), shape["patch_size"], shape["input_size"], shape["in_channels"],
                        shape["num_classes"], learn_sigma=shape["learn_sigma"], mlp_ratio=shape["mlp_ratio"])


def expected_shapes(cfg: dict) -> dict:
    """name -> shape of the state dict of the DiT `cfg` describes (built on the meta device)."""
    import torch

    with torch.device("meta"):
        model = build_dit(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_fits(sd: dict, cfg: dict, source) -> None:
    """Refuse a state dict that does not fit `cfg`, naming the first differing keys and the size the tensors fit."""
    from dit_trainer.checkpoint.files import mismatch

    problem = mismatch(expected_shapes(cfg), sd, cfg["name"])
    if not problem:
        return
    try:
        fit = tensor_shape(sd, source)
        size = release_size(fit["depth"], fit["hidden_size"])
        label = f"DiT-{size}/{fit['patch_size']} " if size else ""
        hint = (f"; the tensors fit {label}(depth {fit['depth']}, hidden {fit['hidden_size']}, "
                f"input_size {fit['input_size']}, num_classes {fit['num_classes']})")
    except Exception:
        hint = ""
    raise CheckpointError(f"{source} does not fit {cfg['name']} ({problem}){hint}")


def fixed_pos_embed(cfg: dict):
    """The (1, N, hidden) sin-cos position table our DiT computes for `cfg` (never trained)."""
    import torch

    from dit_trainer.models.layers import get_2d_sincos_pos_embed

    shape = shape_of(cfg)
    grid = int(cfg["input_size"]) // shape["patch_size"]
    return torch.from_numpy(get_2d_sincos_pos_embed(shape["hidden_size"], grid)).float().unsqueeze(0)


def build_dit(cfg: dict):
    """Our model for a model-config dict, with the timestep convention it records (DiT's options)."""
    from dit_trainer.models import get_spec

    return get_spec(cfg["name"]).build_model_fn(cfg)