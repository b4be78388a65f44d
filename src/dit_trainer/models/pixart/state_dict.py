"""How PixArt's weights map to released checkpoints: our names are PixArt-alpha's release (its
`PixArt.py`/`PixArtMS.py`, the `.pth` files), and `to_diffusers`/`from_diffusers` map them to
diffusers' `PixArtTransformer2DModel` and back.

Two release tensors have no counterpart here: the learned null caption `y_embedder.y_embedding`
(dropped on reading: a dropped caption is the text encoder's encoding of "", as diffusers' pipelines
guide) and, in diffusers, the fixed sin-cos `pos_embed` (a non-persistent buffer there: reading
diffusers' weights leaves it to the model's own table, see `adopt.py`).
"""

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
DROPPED = ("y_embedder.y_embedding",)  # the release's learned null caption
DIFFUSERS_PREFIXES = ("transformer_blocks.", "adaln_single.", "caption_projection.", "proj_out.")

# ours -> diffusers, one to one (weight and bias of each).
_TOP = {
    "x_embedder.proj": "pos_embed.proj",
    "t_embedder.mlp.0": "adaln_single.emb.timestep_embedder.linear_1",
    "t_embedder.mlp.2": "adaln_single.emb.timestep_embedder.linear_2",
    "t_block.1": "adaln_single.linear",
    "csize_embedder.mlp.0": "adaln_single.emb.resolution_embedder.linear_1",
    "csize_embedder.mlp.2": "adaln_single.emb.resolution_embedder.linear_2",
    "ar_embedder.mlp.0": "adaln_single.emb.aspect_ratio_embedder.linear_1",
    "ar_embedder.mlp.2": "adaln_single.emb.aspect_ratio_embedder.linear_2",
    "y_embedder.y_proj.fc1": "caption_projection.linear_1",
    "y_embedder.y_proj.fc2": "caption_projection.linear_2",
    "final_layer.linear": "proj_out",
}
_BLOCK = {
    "attn.proj": "attn1.to_out.0",
    "cross_attn.q_linear": "attn2.to_q",
    "cross_attn.proj": "attn2.to_out.0",
    "mlp.fc1": "ff.net.0.proj",
    "mlp.fc2": "ff.net.2",
}
# Fused projections: ours holds the pieces' rows stacked, diffusers one Linear each.
_FUSED = {"attn.qkv": ("attn1.to_q", "attn1.to_k", "attn1.to_v"), "cross_attn.kv_linear": ("attn2.to_k", "attn2.to_v")}
_TABLES = {"final_layer.scale_shift_table": "scale_shift_table"}


def _strip(state_dict: dict) -> dict:
    out = {}
    for key, value in state_dict.items():
        for prefix in WRAPPER_PREFIXES:
            key = key.removeprefix(prefix)
        out[key] = value
    return out


def _depth(state_dict: dict, prefix: str) -> int:
    return len({k.split(".")[1] for k in state_dict if k.startswith(prefix)})


def is_diffusers(state_dict: dict) -> bool:
    """Whether `state_dict` is in diffusers' PixArtTransformer2DModel names."""
    return any(k.startswith(DIFFUSERS_PREFIXES) for k in state_dict)


def _pairs(depth: int):
    """(our key, diffusers' key) of every one-to-one tensor, and (our key, diffusers' keys) of the fused ones."""
    plain = [(f"{o}.{leaf}", f"{t}.{leaf}") for o, t in _TOP.items() for leaf in ("weight", "bias")]
    plain += list(_TABLES.items())
    fused = []
    for i in range(depth):
        mine, yours = f"blocks.{i}.", f"transformer_blocks.{i}."
        plain.append((mine + "scale_shift_table", yours + "scale_shift_table"))
        for leaf in ("weight", "bias"):
            plain += [(f"{mine}{o}.{leaf}", f"{yours}{t}.{leaf}") for o, t in _BLOCK.items()]
            fused += [(f"{mine}{o}.{leaf}", [f"{yours}{t}.{leaf}" for t in pieces]) for o, pieces in _FUSED.items()]
    return plain, fused


def to_diffusers(state_dict: dict) -> dict:
    """Our (the release's) PixArt weights in diffusers' PixArtTransformer2DModel names (pos_embed left out)."""
    plain, fused = _pairs(_depth(state_dict, "blocks."))
    out = {theirs: state_dict[ours] for ours, theirs in plain if ours in state_dict}
    for ours, pieces in fused:
        out.update({theirs: piece.clone() for theirs, piece in zip(pieces, state_dict[ours].chunk(len(pieces)))})
    return out


def from_diffusers(state_dict: dict) -> dict:
    """diffusers' PixArtTransformer2DModel weights in ours (no pos_embed: the model's fixed table is used)."""
    import torch  # here: registering the family (which imports this adapter) stays torch-free

    plain, fused = _pairs(_depth(state_dict, "transformer_blocks."))
    out = {ours: state_dict[theirs] for ours, theirs in plain if theirs in state_dict}
    out.update({ours: torch.cat([state_dict[t] for t in pieces]) for ours, pieces in fused})
    return out


class PixArtStateDictAdapter:
    """Released PixArt state dict (the `.pth`, or diffusers' names) <-> ours."""

    WRAPPER_PREFIXES = WRAPPER_PREFIXES

    def from_released(self, state_dict: dict) -> dict:
        """A released (`.pth` or diffusers), DDP/compile-wrapped or DiT state dict in our names, without the
        release's learned null caption; another family's names (a DiT's) pass through for `adopt`."""
        state_dict = _strip(state_dict)
        if is_diffusers(state_dict):
            return from_diffusers(state_dict)
        return {k: v for k, v in state_dict.items() if k not in DROPPED}

    def to_released(self, state_dict: dict) -> dict:
        """Our state dict in the release's names (the same)."""
        return dict(state_dict)

    to_diffusers = staticmethod(to_diffusers)
    from_diffusers = staticmethod(from_diffusers)


def diffusers_config(model) -> dict:
    """The `PixArtTransformer2DModel` config of a PixArt `model` (the arguments diffusers builds it from)."""
    from dit_trainer.errors import ConfigError

    heads, hidden = model.num_heads, model.pos_embed.shape[-1]
    if model.blocks[0].mlp.fc1.out_features != 4 * hidden:
        raise ConfigError("diffusers' PixArtTransformer2DModel has an MLP 4 times the width; this model's "
                          "model.mlp_ratio is not 4, so keep it in our format")
    return {"num_attention_heads": heads, "attention_head_dim": hidden // heads, "in_channels": model.in_channels,
            "out_channels": model.out_channels, "num_layers": len(model.blocks), "cross_attention_dim": hidden,
            "sample_size": model.input_size, "patch_size": model.patch_size, "norm_type": "ada_norm_single",
            "num_embeds_ada_norm": 1000, "norm_elementwise_affine": False, "norm_eps": 1e-6,
            "activation_fn": "gelu-approximate", "attention_bias": True,
            "caption_channels": model.y_embedder.y_proj.fc1.in_features,
            "interpolation_scale": model.interpolation_scale, "use_additional_conditions": model.micro_conditions}
