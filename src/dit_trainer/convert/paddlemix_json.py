"""PaddleMIX's DiT model JSON (`config/DiT_XL_patch2.json`) as our model config.

Two spellings occur: diffusers-style (`num_layers`, `num_attention_heads`, `attention_head_dim`,
`sample_size`, `patch_size`, `in_channels`) and DiT-style (`depth`, `hidden_size`, `num_heads`,
`input_size`, ...). Either maps to a `model:` section dict that `config_from_dict` accepts.
"""

import json
from pathlib import Path

from dit_trainer.convert.model_config import model_config
from dit_trainer.errors import ConfigError

DIFFUSERS_KEYS = ("num_layers", "num_attention_heads", "attention_head_dim")


def is_paddlemix_config(data) -> bool:
    """Whether a mapping looks like a PaddleMIX DiT JSON (rather than our YAML layout)."""
    return isinstance(data, dict) and "model" not in data and (
        all(k in data for k in DIFFUSERS_KEYS) or all(k in data for k in ("depth", "hidden_size", "patch_size")))


def model_config_from_paddlemix(data, source="config") -> dict:
    """Our model-config dict (`model:` section) from a PaddleMIX DiT JSON mapping."""
    try:
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
        return model_config(depth, hidden, heads, int(data.get("patch_size", 2)), input_size, in_channels,
                            int(data.get("num_classes", data.get("num_embeds_ada_norm", 1000))),
                            learn_sigma=learn_sigma, class_dropout_prob=float(data.get("class_dropout_prob", 0.1)),
                            mlp_ratio=float(data.get("mlp_ratio", 4.0)))
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{source}: not a PaddleMIX DiT config ({type(err).__name__}: {err})") from None


def load_paddlemix_json(path) -> dict:
    """Read a PaddleMIX DiT JSON file into our model-config dict."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot read a JSON model config ({err})") from None
    if not is_paddlemix_config(data):
        raise ConfigError(f"{path}: not a PaddleMIX DiT config (expected num_layers/num_attention_heads/"
                          "attention_head_dim or depth/hidden_size/patch_size)")
    return model_config_from_paddlemix(data, path)
