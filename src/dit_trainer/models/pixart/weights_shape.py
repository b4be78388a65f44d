"""What a PixArt state dict (or a DiT's, to start a PixArt from) says of its model through its tensors'
shapes: the model keys a run started from those weights must have. Torch-free: it reads `.shape` only."""

import math

from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.models.dit.sizes import SIZES as DIT_SIZES
from dit_trainer.models.dit.weights_shape import tensor_shape as dit_tensor_shape
from dit_trainer.models.pixart.config import PixArtConfig
from dit_trainer.models.pixart.sizes import RELEASES, SIZES, release
from dit_trainer.models.spec import options_from_weights

_NEED = ("x_embedder.proj.weight", "t_block.1.weight", "y_embedder.y_proj.fc1.weight", "final_layer.linear.weight")


def is_pixart(sd: dict) -> bool:
    """Whether `sd` is a PixArt's in our (the release's) names."""
    return all(k in sd for k in _NEED)


def tensor_shape(sd: dict, source="weights") -> dict:
    """Everything but the head count that a PixArt state dict's tensors say (input_size only with pos_embed)."""
    if not is_pixart(sd):
        missing = [k for k in _NEED if k not in sd]
        raise CheckpointError(f"{source} is not a PixArt state dict: it has no {', '.join(missing)} "
                              f"(first keys: {', '.join(list(sd)[:3])}); pass a PixArt or DiT checkpoint")
    proj = sd["x_embedder.proj.weight"]
    hidden, in_channels, patch = int(proj.shape[0]), int(proj.shape[1]), int(proj.shape[-1])
    out_channels = int(sd["final_layer.linear.weight"].shape[0]) // (patch * patch)
    shape = {"depth": len({k.split(".")[1] for k in sd if k.startswith("blocks.")}), "hidden_size": hidden,
             "patch_size": patch, "in_channels": in_channels, "learn_sigma": out_channels == 2 * in_channels,
             "mlp_ratio": sd["blocks.0.mlp.fc1.weight"].shape[0] / hidden,
             "text_hidden_size": int(sd["y_embedder.y_proj.fc1.weight"].shape[1]),
             "micro_conditions": "csize_embedder.mlp.0.weight" in sd}
    if "pos_embed" in sd:  # diffusers' weights hold no positions: the data gives the size then
        shape["input_size"] = math.isqrt(int(sd["pos_embed"].shape[1])) * patch
    return shape


def _heads(hidden: int, options: dict, source) -> int:
    """The head count, which no tensor holds: the user's, else the release's of this width (72 wide)."""
    if options.get("num_heads"):
        return int(options["num_heads"])
    for depth, width, heads in [*SIZES.values(), *DIT_SIZES.values()]:
        if width == hidden:
            return heads
    raise ConfigError(f"{source}: a model of width {hidden} is no release width, so its head count is not known; "
                      "set model.num_heads to the one it was trained with")


def _name_of(shape: dict, source) -> str:
    """The release whose name fits weights the user named no model for."""
    side = shape.get("input_size")
    for r in RELEASES:
        if r.micro_conditions == shape["micro_conditions"] and (side is None or r.resolution == side * 8):
            return r.name
    raise ConfigError(f"{source} is a PixArt of {side}x{side} latents, which no release has; set model.name to the "
                      "PixArt it was trained as")


def weights_shape(sd: dict, name, options: dict, source="weights") -> dict:
    """The model keys (`name`, shared fields, options) a PixArt needs to take `sd`: a PixArt's weights, or
    a DiT's of the same shape when `name` is a PixArt (`adopt.py` then re-parameterises them)."""
    from dit_trainer.models.pixart.adopt import is_dit

    if is_dit(sd):
        if name is None:  # a DiT's weights with no model named are a DiT
            raise CheckpointError(f"{source} is a DiT state dict, not a PixArt's")
        shape = dit_tensor_shape(sd, source)
        shape.pop("num_classes")
        if shape["patch_size"] != 2:
            raise ConfigError(f"{source} is a DiT of patch {shape['patch_size']}; a PixArt's patch is 2, so start "
                              "it from a DiT-*/2")
    else:
        shape = tensor_shape(sd, source)
    given = name is not None
    name = name if given else _name_of(shape, source)
    want = {k: shape[k] for k in ("depth", "hidden_size", "mlp_ratio") if k in shape}
    want["num_heads"] = _heads(shape["hidden_size"], options, source)
    for key in ("text_hidden_size", "micro_conditions"):
        if key in shape:
            want[key] = shape[key]
    implied = PixArtConfig().resolved(release(name).name)
    sizes = options_from_weights(want, implied, options, source, name if given else None, "PixArt")
    shared = {k: shape[k] for k in ("input_size", "in_channels", "learn_sigma") if k in shape}
    return {"name": name, **shared, **sizes}
