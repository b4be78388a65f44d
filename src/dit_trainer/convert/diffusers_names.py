"""Our DiT's tensors (the release's names) <-> diffusers' `DiTTransformer2DModel` tensors.

diffusers fuses nothing and shares nothing: q, k and v are three linears, and every block holds
its own copy of the timestep and label embedders (`norm1.emb`), of which the model only ever reads
block 0's. The final adaLN layer becomes `proj_out_1` (shift, scale) and `proj_out_2`. The fixed
sin-cos position table is not stored; diffusers recomputes it, as our DiT does at construction.
"""

import torch

from dit_trainer.errors import CheckpointError

# Per-block tensors: ours -> diffusers (the `{i}` is the block index).
_BLOCK = {
    "blocks.{i}.adaLN_modulation.1.weight": "transformer_blocks.{i}.norm1.linear.weight",
    "blocks.{i}.adaLN_modulation.1.bias": "transformer_blocks.{i}.norm1.linear.bias",
    "blocks.{i}.attn.proj.weight": "transformer_blocks.{i}.attn1.to_out.0.weight",
    "blocks.{i}.attn.proj.bias": "transformer_blocks.{i}.attn1.to_out.0.bias",
    "blocks.{i}.mlp.fc1.weight": "transformer_blocks.{i}.ff.net.0.proj.weight",
    "blocks.{i}.mlp.fc1.bias": "transformer_blocks.{i}.ff.net.0.proj.bias",
    "blocks.{i}.mlp.fc2.weight": "transformer_blocks.{i}.ff.net.2.weight",
    "blocks.{i}.mlp.fc2.bias": "transformer_blocks.{i}.ff.net.2.bias",
}
# Shared embedders: ours -> diffusers' per-block copy.
_EMBED = {
    "t_embedder.mlp.0.weight": "transformer_blocks.{i}.norm1.emb.timestep_embedder.linear_1.weight",
    "t_embedder.mlp.0.bias": "transformer_blocks.{i}.norm1.emb.timestep_embedder.linear_1.bias",
    "t_embedder.mlp.2.weight": "transformer_blocks.{i}.norm1.emb.timestep_embedder.linear_2.weight",
    "t_embedder.mlp.2.bias": "transformer_blocks.{i}.norm1.emb.timestep_embedder.linear_2.bias",
    "y_embedder.embedding_table.weight": "transformer_blocks.{i}.norm1.emb.class_embedder.embedding_table.weight",
}
_TOP = {
    "x_embedder.proj.weight": "pos_embed.proj.weight",
    "x_embedder.proj.bias": "pos_embed.proj.bias",
    "final_layer.adaLN_modulation.1.weight": "proj_out_1.weight",
    "final_layer.adaLN_modulation.1.bias": "proj_out_1.bias",
    "final_layer.linear.weight": "proj_out_2.weight",
    "final_layer.linear.bias": "proj_out_2.bias",
}
# The one tensor of ours diffusers does not store.
NOT_EXPORTED = ("pos_embed",)


def _depth(sd, prefix) -> int:
    return len({k.split(".")[1] for k in sd if k.startswith(prefix)})


def to_diffusers(sd: dict) -> dict:
    """diffusers' DiTTransformer2DModel state dict from ours (torch layout, tensors copied by reference)."""
    out = {dst: sd[src] for src, dst in _TOP.items()}
    for i in range(_depth(sd, "blocks.")):
        for src, dst in _BLOCK.items():
            out[dst.format(i=i)] = sd[src.format(i=i)]
        for src, dst in _EMBED.items():
            out[dst.format(i=i)] = sd[src]
        # The release fuses [q | k | v] along the output dimension.
        for part in ("weight", "bias"):
            for tag, tensor in zip("qkv", sd[f"blocks.{i}.attn.qkv.{part}"].chunk(3, dim=0)):
                out[f"transformer_blocks.{i}.attn1.to_{tag}.{part}"] = tensor
    return out


def from_diffusers(sd: dict, pos_embed: torch.Tensor, source="transformer") -> dict:
    """Ours from diffusers' names; `pos_embed` is the fixed table our DiT computes for this size."""
    depth = _depth(sd, "transformer_blocks.")
    if depth == 0:
        raise CheckpointError(f"{source} holds no transformer_blocks.*; is it a DiT transformer?")
    try:
        out = {src: sd[dst] for src, dst in _TOP.items()}
        for src, dst in _EMBED.items():
            out[src] = sd[dst.format(i=0)]
            for i in range(1, depth):
                # Only block 0's copy is ever read; a differing copy means a model we cannot represent.
                if not torch.equal(sd[dst.format(i=i)], out[src]):
                    raise CheckpointError(f"{source}: {dst.format(i=i)} differs from block 0's copy; our DiT "
                                          "shares one timestep/label embedder, so this transformer cannot be imported")
        for i in range(depth):
            for src, dst in _BLOCK.items():
                out[src.format(i=i)] = sd[dst.format(i=i)]
            for part in ("weight", "bias"):
                out[f"blocks.{i}.attn.qkv.{part}"] = torch.cat(
                    [sd[f"transformer_blocks.{i}.attn1.to_{t}.{part}"] for t in "qkv"], dim=0)
    except KeyError as err:
        raise CheckpointError(f"{source} has no tensor {err.args[0]}; is it a DiT (norm_type ada_norm_zero) transformer?") from None
    known = set(_TOP.values()) | {d.format(i=i) for i in range(depth) for d in (*_BLOCK.values(), *_EMBED.values())}
    known |= {f"transformer_blocks.{i}.attn1.to_{t}.{p}" for i in range(depth) for t in "qkv" for p in ("weight", "bias")}
    extra = [k for k in sd if k not in known]
    if extra:
        raise CheckpointError(f"{source} holds tensors our DiT has no place for: {', '.join(extra[:3])}")
    out["pos_embed"] = pos_embed
    return out
