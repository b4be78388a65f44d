"""What a DiT (or SiT) state dict says of its model through its tensors' shapes: the model keys a run
started from those weights must have. Torch-free: it reads `.shape` only."""

import math
import re

from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.models.dit.config import RELEASE_BLOCK
from dit_trainer.models.dit.sizes import SIZES, dit_name, release_size, swiglu_width
from dit_trainer.models.spec import options_from_weights

_NAME = re.compile(r"^(\w+)-(S|B|L|XL)/(\d+)$", re.IGNORECASE)


def tensor_shape(sd: dict, source="weights") -> dict:
    """What a DiT state dict (release names) says of its model through its tensor shapes: everything
    but the head count."""
    need = ("x_embedder.proj.weight", "pos_embed", "final_layer.linear.weight", "y_embedder.embedding_table.weight")
    missing = [k for k in need if k not in sd]
    if missing:
        raise CheckpointError(f"{source} is not a DiT state dict: it has no {', '.join(missing)} "
                              f"(first keys: {', '.join(list(sd)[:3])}); pass a DiT checkpoint")
    proj = sd["x_embedder.proj.weight"]
    hidden, in_channels, patch = int(proj.shape[0]), int(proj.shape[1]), int(proj.shape[-1])
    grid = math.isqrt(int(sd["pos_embed"].shape[1]))
    out_channels = int(sd["final_layer.linear.weight"].shape[0]) // (patch * patch)
    fc1, w1 = sd.get("blocks.0.mlp.fc1.weight"), sd.get("blocks.0.mlp.w1.weight")
    ratio = fc1.shape[0] / hidden if fc1 is not None else _swiglu_ratio(int(w1.shape[0]), hidden) if w1 is not None else 4.0
    # Released checkpoints and ours always hold the null-class row that guidance needs.
    return {"depth": len({k.split(".")[1] for k in sd if k.startswith("blocks.")}), "hidden_size": hidden,
            "patch_size": patch, "input_size": grid * patch, "in_channels": in_channels,
            "num_classes": int(sd["y_embedder.embedding_table.weight"].shape[0]) - 1,
            "learn_sigma": out_channels == 2 * in_channels,
            "mlp_ratio": ratio}


def _swiglu_ratio(width: int, hidden: int) -> float:
    """The mlp_ratio whose SwiGLU width is `width`: 4 where it fits, else the smallest GELU width that gives it."""
    if swiglu_width(hidden, 4.0) == width:
        return 4.0
    mlp = next((m for m in range(width * 3 // 2 - 1, width * 3 // 2 + 3) if swiglu_width(m, 1.0) == width), width * 3 // 2)
    return mlp / hidden


def block_options_of(sd: dict) -> dict:
    """The block options (`model.norm`, `mlp`, `qk_norm`) a DiT state dict's tensor names show, where they are
    not the release's; RoPE holds no tensor, so only a run's config tells it."""
    found = {"norm": "rmsnorm" if "final_layer.norm_final.weight" in sd else "layernorm",
             "mlp": "swiglu" if "blocks.0.mlp.w1.weight" in sd else "gelu",
             "qk_norm": "blocks.0.attn.q_norm.weight" in sd}
    return {k: v for k, v in found.items() if v != RELEASE_BLOCK[k]}


def _heads(depth: int, hidden: int, size, options: dict, source) -> int:
    """The head count, which no tensor holds: the user's, the release size's of this depth and width,
    the named size's or any release size's of this width (DiT's heads are 64-72 wide)."""
    if options.get("num_heads"):
        return int(options["num_heads"])
    fits = [release_size(depth, hidden), size, *SIZES]
    for name in fits:
        if name in SIZES and SIZES[name][1] == hidden:
            return SIZES[name][2]
    raise ConfigError(f"{source}: a DiT of width {hidden} is no release width, so its head count is not known; "
                      f"set model.num_heads to the one it was trained with")


def weights_shape(sd: dict, name, options: dict, source="weights") -> dict:
    """The model keys (`name`, shared fields, size options) a DiT-family model needs to take `sd`.

    `name` is the user's model.name (None: the weights name it; the family is DiT then, since SiT's
    tensors are DiT's), `options` the family options the user set; a value of theirs the tensors
    contradict is a one-line ConfigError.
    """
    shape = tensor_shape(sd, source)
    depth, hidden, patch = shape["depth"], shape["hidden_size"], shape["patch_size"]
    match = _NAME.match(str(name)) if name else None
    size = match.group(2).upper() if match else None
    heads = _heads(depth, hidden, size, options, source)
    fit, overrides = dit_name(depth, hidden, heads, patch)
    family = match.group(1) if match else "DiT"  # SiT's tensors are DiT's: the name tells them apart
    what = fit.replace("DiT", family, 1) + "".join(f", model.{k} {v}" for k, v in overrides.items())
    given = name is not None
    if not given:
        name, size = fit, fit.split("-")[1].split("/")[0]
    elif match is None or int(match.group(3)) != patch:
        raise ConfigError(f"model.name {name} does not fit {source}: its tensors are a {what} (patch {patch}); "
                          "leave model.name out (the weights decide it) or set it to that")
    base = dict(zip(("depth", "hidden_size", "num_heads"), SIZES[size]), mlp_ratio=4.0)
    want = {"depth": depth, "hidden_size": hidden, "num_heads": heads, "mlp_ratio": shape["mlp_ratio"]}
    shared = {k: shape[k] for k in ("input_size", "in_channels", "num_classes", "learn_sigma")}
    sizes = options_from_weights(want, base, options, source, name if given else None, what)
    # The block options are the tensors' whatever the name (a user's value they contradict is an error).
    blocks = options_from_weights({**{k: v for k, v in RELEASE_BLOCK.items() if k != "rope"}, **block_options_of(sd)},
                                  RELEASE_BLOCK, options, source)
    return {"name": name, **shared, **sizes, **blocks}
