"""State-dict layouts of DINOv2 weights: the official torch-hub one (ours) and transformers' Dinov2Model /
Dinov2WithRegistersModel one, and the mapping between them.

transformers splits the fused qkv projection into query/key/value (in that order), renames layer scale
`gamma` to `lambda1` and the SwiGLU `w12`/`w3` to `weights_in`/`weights_out`; everything else is a rename.
"""

import re

import torch

# (torch-hub name, transformers name) of the tensors outside the blocks.
_TOP = [
    ("cls_token", "embeddings.cls_token"),
    ("mask_token", "embeddings.mask_token"),
    ("pos_embed", "embeddings.position_embeddings"),
    ("register_tokens", "embeddings.register_tokens"),
    ("patch_embed.proj.weight", "embeddings.patch_embeddings.projection.weight"),
    ("patch_embed.proj.bias", "embeddings.patch_embeddings.projection.bias"),
    ("norm.weight", "layernorm.weight"),
    ("norm.bias", "layernorm.bias"),
]
# (torch-hub suffix, transformers suffix) inside block i.
_BLOCK = [
    ("norm1", "norm1"),
    ("norm2", "norm2"),
    ("attn.proj", "attention.output.dense"),
    ("ls1.gamma", "layer_scale1.lambda1"),
    ("ls2.gamma", "layer_scale2.lambda1"),
    ("mlp.fc1", "mlp.fc1"),
    ("mlp.fc2", "mlp.fc2"),
    ("mlp.w12", "mlp.weights_in"),
    ("mlp.w3", "mlp.weights_out"),
]
_QKV = ("query", "key", "value")
# Wrappers transformers and dinov2's training code put around the backbone's names.
_PREFIXES = ("dinov2.", "dinov2_with_registers.", "backbone.", "module.")


def strip_prefixes(state_dict: dict) -> dict:
    """The backbone's tensors of a wrapped state dict: keys under a wrapper prefix (dinov2.,
    dinov2_with_registers., backbone., module.) with it removed; the wrapper's own tensors (a classifier,
    a DINO head) are left out."""
    for prefix in _PREFIXES:
        if any(k.startswith(prefix) for k in state_dict):
            state_dict = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    return state_dict


def is_transformers_layout(state_dict: dict) -> bool:
    """Whether keys are transformers' (embeddings.*, encoder.layer.*) rather than torch-hub's."""
    return any(k.startswith(("embeddings.", "encoder.layer.")) for k in state_dict)


def _rename_block(key: str, table, src: int, dst: int, src_prefix: str, dst_prefix: str):
    match = re.match(rf"{re.escape(src_prefix)}(\d+)\.(.+)$", key)
    if not match:
        return None
    index, rest = match.groups()
    for pair in table:
        if rest == pair[src] or rest.startswith(pair[src] + "."):
            return f"{dst_prefix}{index}.{pair[dst]}{rest[len(pair[src]):]}"
    return None


def transformers_to_hub(state_dict: dict) -> dict:
    """torch-hub-layout copy of a transformers Dinov2Model state dict; unknown keys are kept as they are."""
    top = {hf: hub for hub, hf in _TOP}
    out, qkv = {}, {}
    for key, value in state_dict.items():
        match = re.match(r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$", key)
        if match:
            index, part, kind = match.groups()
            qkv.setdefault((index, kind), {})[part] = value
            continue
        renamed = top.get(key) or _rename_block(key, _BLOCK, 1, 0, "encoder.layer.", "blocks.")
        out[renamed or key] = value
    for (index, kind), parts in qkv.items():
        # An incomplete triple is left out: the strict load then names the missing qkv tensor.
        if all(p in parts for p in _QKV):
            out[f"blocks.{index}.attn.qkv.{kind}"] = torch.cat([parts[p] for p in _QKV], dim=0)
    return out


def hub_to_transformers(state_dict: dict) -> dict:
    """transformers-layout (Dinov2Model / Dinov2WithRegistersModel) copy of a torch-hub state dict."""
    top = dict(_TOP)
    out = {}
    for key, value in state_dict.items():
        match = re.match(r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", key)
        if match:
            index, kind = match.groups()
            for part, chunk in zip(_QKV, value.chunk(3, dim=0)):
                out[f"encoder.layer.{index}.attention.attention.{part}.{kind}"] = chunk.clone()
            continue
        renamed = top.get(key) or _rename_block(key, _BLOCK, 0, 1, "blocks.", "encoder.layer.")
        out[renamed or key] = value
    return out
