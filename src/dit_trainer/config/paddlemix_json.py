"""PaddleMIX's DiT model JSON (`config/DiT_XL_patch2.json`) as our model config.

Two spellings occur: diffusers-style (`num_layers`, `num_attention_heads`, `attention_head_dim`,
`sample_size`, `patch_size`, `in_channels`) and DiT-style (`depth`, `hidden_size`, `num_heads`,
`input_size`, ...). Either maps to a `model:` section dict that `build_config` accepts.
PaddleMIX's `config/LargeDiT_*.json` use the diffusers spelling for its DiT-LLaMA; like PaddleMIX,
the file name (or a key only that model has) tells them apart, and they map to `LargeDiT-*/2`.
Its `config/SiT_XL_patch2.json` holds the same keys as the DiT file (SiT is DiT's network trained
as transport; PaddleMIX picks it by the script run), so the file name decides there too: `SiT_*`
maps to `SiT-XL/2`, which `objective: auto` trains as SiT.
"""

import json
from pathlib import Path, PurePath

from dit_trainer.errors import ConfigError
from dit_trainer.fs import check_regular
from dit_trainer.models.dit.sizes import model_config
from dit_trainer.models.large_dit.sizes import SIZES as LARGE_DIT_SIZES

DIFFUSERS_KEYS = ("num_layers", "num_attention_heads", "attention_head_dim")


def is_paddlemix_config(data) -> bool:
    """Whether a mapping looks like a PaddleMIX DiT JSON (rather than our YAML layout)."""
    return isinstance(data, dict) and "model" not in data and (
        all(k in data for k in DIFFUSERS_KEYS) or all(k in data for k in ("depth", "hidden_size", "patch_size")))


# Keys of ppdiffusers' DiTLLaMA2DModel that its DiT does not have.
LLAMA_KEYS = ("qk_norm", "n_kv_heads", "multiple_of", "ffn_dim_multiplier", "norm_eps")


def is_large_dit(data, source="config") -> bool:
    """Whether a PaddleMIX model JSON describes its DiT-LLaMA: PaddleMIX decides by the file name."""
    return PurePath(str(source)).name.startswith("LargeDiT_") or any(k in data for k in LLAMA_KEYS)


def large_dit_config(data, source="config") -> dict:
    """Our `model:` section for PaddleMIX's DiT-LLaMA JSON (ppdiffusers' DiTLLaMA2DModel defaults)."""
    heads, layers = int(data["num_attention_heads"]), int(data["num_layers"])
    dim = heads * int(data["attention_head_dim"])
    size = next((k for k, shape in LARGE_DIT_SIZES.items() if shape == (dim, layers, heads)), None)
    cfg = {"name": f"LargeDiT-{size or '600M'}/2", "input_size": int(data.get("sample_size", 32)),
           "in_channels": int(data.get("in_channels", 4)), "num_classes": int(data.get("num_classes", 1000)),
           "learn_sigma": bool(data.get("learn_sigma", True)),
           "class_dropout_prob": float(data.get("class_dropout_prob", 0.1)),
           # ppdiffusers turns q/k norm on unless the file says otherwise (the 3B file does).
           "qk_norm": bool(data.get("qk_norm", True)), "patch_size": int(data.get("patch_size", 2))}
    if size is None:
        cfg.update(dim=dim, n_layers=layers, n_heads=heads)
    for key in LLAMA_KEYS[1:]:
        if data.get(key) is not None:
            cfg[key] = data[key]
    if float(data.get("mlp_ratio", 4.0)) != 4.0:
        raise ConfigError(f"{source}: mlp_ratio {data['mlp_ratio']}: Large-DiT's SwiGLU width is 8/3 x dim "
                          "(use ffn_dim_multiplier)")
    return cfg


def is_sit(source) -> bool:
    """Whether a PaddleMIX model JSON is its SiT's: only the file name tells (`config/SiT_XL_patch2.json`)."""
    return PurePath(str(source)).name.startswith("SiT_")


def model_config_from_paddlemix(data, source="config") -> dict:
    """Our model-config dict (`model:` section) from a PaddleMIX DiT or DiT-LLaMA JSON mapping."""
    try:
        if all(k in data for k in DIFFUSERS_KEYS) and is_large_dit(data, source):
            return large_dit_config(data, source)
        if all(k in data for k in DIFFUSERS_KEYS):
            heads = int(data["num_attention_heads"])
            depth, hidden = int(data["num_layers"]), heads * int(data["attention_head_dim"])
            input_size = int(data.get("sample_size", 32))
        else:
            depth, hidden, heads = int(data["depth"]), int(data["hidden_size"]), int(data.get("num_heads", 16))
            input_size = int(data.get("input_size", 32))
        in_channels = int(data.get("in_channels", 4))
        out_channels = data.get("out_channels")
        learn_sigma = bool(data.get("learn_sigma", True)) if out_channels is None else int(out_channels) == 2 * in_channels
        cfg = model_config(depth, hidden, heads, int(data.get("patch_size", 2)), input_size, in_channels,
                           int(data.get("num_classes", data.get("num_embeds_ada_norm", 1000))),
                           learn_sigma=learn_sigma, class_dropout_prob=float(data.get("class_dropout_prob", 0.1)),
                           mlp_ratio=float(data.get("mlp_ratio", 4.0)))
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{source}: not a PaddleMIX DiT config ({type(err).__name__}: {err})") from None
    if is_sit(source):
        cfg["name"] = "SiT" + cfg["name"][len("DiT"):]
    return cfg


def load_paddlemix_json(path) -> dict:
    """Read a PaddleMIX DiT JSON file into our model-config dict."""
    path = Path(path)
    check_regular(path, ConfigError, "a model config")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot read a JSON model config ({err})") from None
    if not is_paddlemix_config(data):
        raise ConfigError(f"{path}: not a PaddleMIX DiT config (expected num_layers/num_attention_heads/"
                          "attention_head_dim or depth/hidden_size/patch_size)")
    return model_config_from_paddlemix(data, path)
