"""Loading DINOv2 weights into an Encoder: an official torch-hub .pth file, a transformers folder
(config.json + model.safetensors or pytorch_model.bin), a Hugging Face id already in the local cache,
or "torch.hub" for the file torch.hub.load left in its cache. Nothing is downloaded here: a missing
file is a one-line error naming what to download and where to put it.
"""

import dataclasses
import json
import math
import os

import torch

from dit_trainer.encoders.layouts import is_transformers_layout, strip_prefixes, transformers_to_hub
from dit_trainer.encoders.registry import SPECS, hf_id, torch_hub_file, torch_hub_url
from dit_trainer.errors import CheckpointError, one_line

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_FILE_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")


def read_state_dict(path: str) -> dict:
    """Tensors of a .safetensors file (safetensors) or a .pth/.pt/.bin file (torch.load, weights_only)."""
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            try:
                # mmap: ViT-g's 4.5 GB are paged in as they are copied, not held twice.
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # a pre-1.6 (non-zip) file cannot be mapped
                state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise CheckpointError(f"cannot read encoder weights {path} ({one_line(err)}); pass the torch-hub "
                              f".pth file or a transformers folder") from None
    if isinstance(state, dict) and isinstance(state.get("teacher"), dict):
        state = state["teacher"]  # a dinov2 training checkpoint: its teacher backbone is the released model
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"encoder weights {path} are not a state dict of tensors; pass the torch-hub .pth "
                              f"file or a transformers folder")
    return strip_prefixes(state)


def _folder_weights(folder: str) -> str:
    for name in _WEIGHT_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    raise CheckpointError(f"encoder folder {folder} has none of {', '.join(_WEIGHT_FILES)}; pass a folder written by "
                          f"transformers' save_pretrained or the torch-hub .pth file")


def _hf_cache_folder(repo_id: str, name: str) -> str:
    """The local snapshot folder of Hugging Face repo `repo_id`; CheckpointError when it is not cached."""
    hint = (f"download it where it is reachable (`hf download {repo_id}` with this machine's HF_HOME) or fetch "
            f"{torch_hub_url(name)} and pass its path")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        raise CheckpointError(f"encoder weights {repo_id!r} need huggingface_hub (pip install huggingface_hub), "
                              f"or {hint}") from None
    try:
        return snapshot_download(repo_id, local_files_only=True, allow_patterns=["config.json", *_WEIGHT_FILES])
    except Exception:  # noqa: BLE001 - any failure means the snapshot is not usable offline
        raise CheckpointError(f"encoder weights {repo_id!r} are not in the Hugging Face cache {HF_HUB_CACHE}; "
                              f"{hint}") from None


def resolve(weights: str, name: str) -> str:
    """The local file or folder that `weights` names for encoder `name`."""
    weights = os.path.expanduser(os.fspath(weights))
    if weights == "torch.hub":
        path = os.path.join(torch.hub.get_dir(), "checkpoints", torch_hub_file(name))
        if not os.path.isfile(path):
            raise CheckpointError(f"encoder weights {path} do not exist; download {torch_hub_url(name)} to that path")
        return path
    if os.path.exists(weights):
        return weights
    if weights.count("/") == 1 and not weights.startswith(".") and not weights.endswith(_FILE_SUFFIXES):
        return _hf_cache_folder(weights, name)
    raise CheckpointError(f"encoder weights {weights} do not exist; download {torch_hub_url(name)} to that path "
                          f"(or pass a transformers folder, or a Hugging Face id such as {hf_id(name)})")


def _config_check(folder: str, encoder) -> None:
    """CheckpointError when a transformers config.json describes another architecture than `encoder`."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path} ({one_line(err)}); re-save the folder with save_pretrained") from None
    shape = encoder.shape
    wanted = {"hidden_size": shape.embed_dim, "num_hidden_layers": shape.depth,
              "num_attention_heads": shape.num_heads, "patch_size": shape.patch_size,
              "use_swiglu_ffn": shape.swiglu, "num_register_tokens": shape.num_register_tokens}
    for key, value in wanted.items():
        got = config.get(key, 0 if key == "num_register_tokens" else value)
        if got != value:
            raise CheckpointError(f"{path} has {key} {got} but encoder {encoder.name} has {value}; "
                                  f"{_suggest(config_dims(config))}")


def config_dims(config: dict) -> tuple:
    """(embed_dim, depth, num_register_tokens) a transformers config describes."""
    return config.get("hidden_size"), config.get("num_hidden_layers"), config.get("num_register_tokens", 0)


def state_dims(state: dict) -> tuple:
    """(embed_dim, depth, num_register_tokens) of a torch-hub-layout state dict."""
    cls = state.get("cls_token")
    depth = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    regs = state["register_tokens"].shape[1] if "register_tokens" in state else 0
    return (cls.shape[-1] if cls is not None else None), depth, regs


def _suggest(dims: tuple) -> str:
    for spec_name, spec in SPECS.items():
        if (spec.embed_dim, spec.depth, spec.num_register_tokens) == dims:
            return f"these weights are {spec_name}: build that encoder"
    return "pass the encoder name these weights belong to"


def _fit_pos_embed(encoder, state: dict, source: str) -> None:
    """Give `encoder` the checkpoint's position-embedding grid (transformers folders may store any image_size)."""
    pos = state.get("pos_embed")
    if pos is None or pos.shape == encoder.pos_embed.shape:
        return
    grid = math.isqrt(pos.shape[1] - 1)
    if pos.ndim != 3 or grid * grid != pos.shape[1] - 1 or pos.shape[2] != encoder.embed_dim:
        raise CheckpointError(f"{source}: pos_embed has shape {tuple(pos.shape)}, not (1, 1 + n², "
                              f"{encoder.embed_dim}); pass weights of encoder {encoder.name}")
    encoder.pos_embed = torch.nn.Parameter(encoder.pos_embed.new_zeros(pos.shape), requires_grad=False)
    encoder.shape = dataclasses.replace(encoder.shape, img_size=grid * encoder.patch_size)


def load_weights(encoder, weights: str) -> None:
    """Load `weights` (see the module docstring) into `encoder` in place; CheckpointError in one line."""
    path = resolve(weights, encoder.name)
    if os.path.isdir(path):
        _config_check(path, encoder)
        path = _folder_weights(path)
    state = read_state_dict(path)
    if is_transformers_layout(state):
        state = transformers_to_hub(state)
    dims = state_dims(state)
    ours = (encoder.embed_dim, encoder.shape.depth, encoder.num_register_tokens)
    if dims != ours:
        raise CheckpointError(f"{path} holds a ViT with (width, depth, registers) {dims}, encoder {encoder.name} "
                              f"is {ours}; {_suggest(dims)}")
    _fit_pos_embed(encoder, state, path)
    own = encoder.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        what = f"misses {missing[0]}" if missing else f"has unexpected {unexpected[0]}"
        raise CheckpointError(f"{path} {what} ({len(missing)} missing, {len(unexpected)} unexpected keys); "
                              f"pass DINOv2 weights of encoder {encoder.name}")
    for key, value in state.items():
        if value.shape != own[key].shape:
            raise CheckpointError(f"{path}: {key} has shape {tuple(value.shape)}, encoder {encoder.name} expects "
                                  f"{tuple(own[key].shape)}; pass weights of that encoder")
    encoder.load_state_dict(state, strict=True)
