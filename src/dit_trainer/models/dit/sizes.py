"""DiT's named sizes as plain data, free of torch, so other backends (MindSpore), config files and
converters share the table; and the model section of a DiT of a given shape.

`SIZES[size] = (depth, hidden_size, num_heads)`; every size comes with patch 2, 4 and 8, which
gives the release's twelve names ("DiT-S/2" ... "DiT-XL/8"). The head count is not in the
tensors, so a shape is named by the release size it matches.
"""

from dit_trainer.errors import ConfigError

SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
PATCHES = (2, 4, 8)


def dit_size(name: str) -> dict:
    """{"depth", "hidden_size", "num_heads", "patch_size"} of a name like "DiT-S/2" (KeyError if unknown)."""
    family, _, rest = name.partition("-")
    size, _, patch = rest.partition("/")
    if family != "DiT" or size not in SIZES or not patch.isdigit() or int(patch) not in PATCHES:
        raise KeyError(name)
    depth, hidden, heads = SIZES[size]
    return {"depth": depth, "hidden_size": hidden, "num_heads": heads, "patch_size": int(patch)}


NAMES = tuple(f"DiT-{size}/{patch}" for size in SIZES for patch in PATCHES)


def swiglu_width(hidden_size: int, mlp_ratio: float = 4.0) -> int:
    """SwiGLU's hidden width under `model.mlp swiglu`: 2/3 of the GELU MLP's, truncated as LightningDiT
    computes it (so its three matrices hold the two of the GELU MLP's parameters; DiT-L's 4096 gives 2730)."""
    return int(2 / 3 * int(hidden_size * mlp_ratio))


# The release's function: frequencies over half the embedding, LayerNorm eps 1e-6 everywhere.
# diffusers' port divides by half - 1 and gives the MLP's LayerNorm (norm2) eps 1e-5.
RELEASE_CONVENTION = {"timestep_freq_shift": 0, "mlp_norm_eps": 1e-6}
DIFFUSERS_CONVENTION = {"timestep_freq_shift": 1, "mlp_norm_eps": 1e-5}
CONVENTION_KEYS = tuple(RELEASE_CONVENTION)


def release_size(depth, hidden_size):
    """The release size (S, B, L, XL) of this depth and width, or None: what fixes the head count."""
    return next((size for size, (d, w, _) in SIZES.items() if (d, w) == (depth, hidden_size)), None)


def dit_name(depth, hidden_size, num_heads, patch_size) -> tuple:
    """(registered name, size overrides) for a DiT of this shape: a release size, or S with overrides."""
    if patch_size not in PATCHES:
        raise ConfigError(f"patch size {patch_size} is not one of DiT's {PATCHES}")
    for size, shape in SIZES.items():
        if shape == (depth, hidden_size, num_heads):
            return f"DiT-{size}/{patch_size}", {}
    return f"DiT-S/{patch_size}", {"depth": int(depth), "hidden_size": int(hidden_size), "num_heads": int(num_heads)}


def model_config(depth, hidden_size, num_heads, patch_size, input_size, in_channels=4, num_classes=1000,
                 learn_sigma=True, class_dropout_prob=0.1, mlp_ratio=4.0, **convention) -> dict:
    """Our model-config dict for a DiT of this shape (size overrides only where needed)."""
    name, overrides = dit_name(depth, hidden_size, num_heads, patch_size)
    cfg = {"name": name, "input_size": int(input_size), "in_channels": int(in_channels),
           "num_classes": int(num_classes), "learn_sigma": bool(learn_sigma),
           "class_dropout_prob": float(class_dropout_prob), **overrides}
    if float(mlp_ratio) != 4.0:
        cfg["mlp_ratio"] = float(mlp_ratio)
    for key, value in convention.items():
        if key not in RELEASE_CONVENTION:
            raise ConfigError(f"unknown timestep convention key {key!r}; known: {', '.join(CONVENTION_KEYS)}")
        if value != RELEASE_CONVENTION[key]:
            cfg[key] = value
    return cfg
