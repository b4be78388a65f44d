"""A PixArt started from a DiT of the same shape (`model.weights_path` naming a DiT checkpoint): PixArt-
alpha's first stage was class-conditional ImageNet, and DiT-XL/2 has its shape.

What a DiT holds loads as is: the patch embedding, the timestep MLP, every block's attention and MLP,
and the head's linear map. What PixArt adds keeps the model's own initialisation: the caption
projection, every cross-attention (its output projection zero, so a block starts by adding nothing
of the caption), and the micro-condition embedders. adaLN-single is re-parameterised as the paper's
section 2.3 does: `t_block` is the mean of the DiT's per-block adaLN maps, and each block's
`scale_shift_table` E(i) is what makes the block's modulation equal the DiT's at t = 500 for the
null class; the final layer's table likewise. So at t = 500 the new model computes the DiT's output
for the null class, whatever the caption, and training moves it from there.
"""

import sys

import torch
import torch.nn.functional as F

from dit_trainer.errors import CheckpointError
from dit_trainer.models.layers import timestep_embedding

ANCHOR_T = 500  # the paper's t at which the re-parameterised modulations equal the DiT's


def is_dit(state_dict: dict) -> bool:
    """Whether `state_dict` is a DiT's (per-block adaLN maps and a label table), in the release's names."""
    return "blocks.0.adaLN_modulation.1.weight" in state_dict and "final_layer.adaLN_modulation.1.weight" in state_dict


def _shared_keys(model_sd: dict, dit: dict, depth: int) -> list:
    keys = [k for k in model_sd if k.startswith(("x_embedder.", "t_embedder.", "final_layer.linear."))]
    for i in range(depth):
        keys += [k for k in model_sd if k.startswith((f"blocks.{i}.attn.", f"blocks.{i}.mlp."))]
    return keys


def _check_shapes(own: dict, dit: dict, keys, source) -> None:
    dit_depth = len({k.split(".")[1] for k in dit if k.startswith("blocks.")})
    own_depth = len({k.split(".")[1] for k in own if k.startswith("blocks.")})
    if dit_depth != own_depth:
        raise CheckpointError(f"{source} is a DiT of {dit_depth} blocks but the PixArt has {own_depth}; set "
                              f"model.depth {dit_depth} or start from a DiT of {own_depth} blocks")
    for key in keys:
        if key not in dit:
            raise CheckpointError(f"{source} has no {key}: it is not a DiT of the release's block (LayerNorm, "
                                  "GELU MLP), which a PixArt shares; start from such a DiT")
        if tuple(dit[key].shape) != tuple(own[key].shape):
            raise CheckpointError(f"{source}'s {key} is {tuple(dit[key].shape)} but the PixArt's is "
                                  f"{tuple(own[key].shape)}; start from a DiT of the PixArt's shape (width, patch, "
                                  "channels, learn_sigma)")


def _modulations(dit: dict, depth: int):
    """(t_emb*, per-block DiT modulations (depth, 6D), final DiT modulation (2D)) at t = ANCHOR_T, null class."""
    f = timestep_embedding(torch.tensor([float(ANCHOR_T)]), dit["t_embedder.mlp.0.weight"].shape[1]).double()

    def linear(x, key):
        return F.linear(x, dit[f"{key}.weight"].double(), dit[f"{key}.bias"].double())

    t_emb = linear(F.silu(linear(f, "t_embedder.mlp.0")), "t_embedder.mlp.2")[0]
    c = t_emb.clone()
    table = dit.get("y_embedder.embedding_table.weight")
    if table is not None:  # its last row is the null class, where the DiT was trained with label dropout
        c = c + table[-1].double()
    blocks = torch.stack([linear(F.silu(c), f"blocks.{i}.adaLN_modulation.1") for i in range(depth)])
    return t_emb, blocks, linear(F.silu(c), "final_layer.adaLN_modulation.1")


def from_dit(model, dit: dict, source) -> dict:
    """The full state dict of `model` (a freshly built PixArt) started from DiT weights `dit` (our names)."""
    own = model.state_dict()
    depth, hidden = len(model.blocks), model.pos_embed.shape[-1]
    shared = _shared_keys(own, dit, depth)
    _check_shapes(own, dit, shared, source)
    out = dict(own)
    out.update({k: dit[k].to(own[k].dtype) for k in shared})
    t_emb, mods, final = _modulations(dit, depth)
    # t_block: one map for every block, the mean of the DiT's; E(i) absorbs each block's difference at t*.
    w = torch.stack([dit[f"blocks.{i}.adaLN_modulation.1.weight"].double() for i in range(depth)]).mean(0)
    b = torch.stack([dit[f"blocks.{i}.adaLN_modulation.1.bias"].double() for i in range(depth)]).mean(0)
    shared_mod = F.linear(F.silu(t_emb), w, b)
    out["t_block.1.weight"], out["t_block.1.bias"] = w.float(), b.float()
    for i in range(depth):
        out[f"blocks.{i}.scale_shift_table"] = (mods[i] - shared_mod).reshape(6, hidden).float()
    out["final_layer.scale_shift_table"] = (final.reshape(2, hidden) - t_emb[None]).float()
    return out


def adopt_weights(model, state_dict: dict, source, log: bool = True) -> dict:
    """`state_dict` as a full state dict of the PixArt `model`: a DiT's re-parameterised (one log line), a
    PixArt's without the fixed positions (diffusers holds none) given the model's own."""
    if is_dit(state_dict):
        out = from_dit(model, state_dict, source)
        if log:
            micro = ", the micro-condition embedders" if getattr(model, "micro_conditions", False) else ""
            print(f"model.weights_path {source} is a DiT: loaded its patch embedding, timestep MLP, {len(model.blocks)} "
                  f"blocks' attention and MLP and the head's linear map; initialised anew the caption projection, "
                  f"the cross-attention layers (output projection zero){micro}; adaLN-single (t_block and each "
                  f"block's scale_shift_table) re-parameterised from the DiT's adaLN at t={ANCHOR_T} (PixArt, "
                  "section 2.3); the DiT's label embedding is not used", file=sys.stderr)
        return out
    if "pos_embed" not in state_dict:
        return {**state_dict, "pos_embed": model.state_dict()["pos_embed"]}
    return state_dict
