"""What a frozen text encoder costs `dit plan`: its parameters and forward FLOPs per caption, from its
config.json alone (no weights loaded), counted as encoders/costs.py counts REPA's encoder: 2 FLOPs per
multiply-add of every matmul over the caption's `max_length` tokens (captions are padded to it) and
2·2·T²·(heads·head width) per layer for attention; norms, activations and softmax not counted.

Training that encodes captions online (an image folder with `data.text_encoder`) holds the encoder
beside the model, sharded over `dp_shard` under FSDP (`parallelize`), and runs it on every caption of
every step until the latent cache is complete; on cached embeddings (`dit extract` shards) it costs
nothing. `with_text_encoder` adds it to a family's `ModelCosts`.
"""

import os
from dataclasses import replace

from dit_trainer.errors import ConfigError
from dit_trainer.text_encoders.folders import _layout, _read_json, _download_hint

# What `data.text_dtype` stores the weights in; auto is bf16, what a GPU run loads.
_DTYPE_BYTES = {"auto": 2, "bf16": 2, "fp32": 4}
# The token count each kind reads when data.text_max_length is 0 (text_encoders.encoder.KINDS).
_DEFAULT_LENGTH = {"t5": 120, "gemma2": 300}


def read_config(name) -> dict:
    """The config.json of text encoder `name` (a folder, or a Hub id in the local cache); one line when absent."""
    folder = os.path.expanduser(os.fspath(name))
    if os.path.isdir(folder):
        return _read_json(os.path.join(_layout(folder)[0], "config.json"))
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        try_to_load_from_cache = None
    for file in ("config.json", "text_encoder/config.json"):
        path = try_to_load_from_cache(str(name), file) if try_to_load_from_cache is not None else None
        if isinstance(path, str) and os.path.isfile(path):
            return _read_json(path)
    raise ConfigError(f"dit plan counts the text encoder data.text_encoder {name} from its config.json, which is not "
                      f"here; {_download_hint(name)}")


def _text_config(config: dict) -> dict:
    """The text tower's config (a CLIPModel's `text_config`), with the projection width where there is one."""
    if config.get("model_type") == "clip":
        return {**config.get("text_config", {}), "projection_dim": config.get("projection_dim", 512),
                "model_type": "clip_text_model"}
    return config


def _shape(config: dict):
    """(kind, layers, hidden, attention width, kv width, per-layer weights of the matmuls, other parameters)."""
    c = _text_config(config)
    kind = c.get("model_type")
    if kind == "t5":
        d, inner, ff, n = c["d_model"], c["num_heads"] * c["d_kv"], c["d_ff"], c["num_layers"]
        gated = str(c.get("feed_forward_proj", "relu")).startswith("gated")
        matmul = 4 * d * inner + (3 if gated else 2) * d * ff
        # shared embedding (tied to the encoder's), 2 norms per layer, layer 0's relative position table, final norm
        other = c["vocab_size"] * d + n * 2 * d + c.get("relative_attention_num_buckets", 32) * c["num_heads"] + d
        return "t5", n, d, inner, inner, matmul, other
    if kind == "clip_text_model":
        d, ff, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        matmul = 4 * d * d + 2 * d * ff
        biases, norms = 4 * d + ff + d, 4 * d
        other = (c["vocab_size"] + c["max_position_embeddings"]) * d + n * (biases + norms) + 2 * d
        return "clip", n, d, d, d, matmul, other + d * c["projection_dim"]
    if kind == "gemma2":
        d, ff, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        heads, kv, hd = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"]), c["head_dim"]
        matmul = 2 * d * heads * hd + 2 * d * kv * hd + 3 * d * ff
        return "gemma2", n, d, heads * hd, kv * hd, matmul, c["vocab_size"] * d + n * 4 * d + d
    raise ConfigError(f"dit plan counts T5, CLIP and Gemma 2 text encoders; this config.json describes {kind!r}")


def param_count(config: dict) -> int:
    """Parameters of the text encoder a config.json describes (what `TextEncoder.model` holds)."""
    _, layers, _, _, _, matmul, other = _shape(config)
    return layers * matmul + other


def forward_flops(config: dict, tokens: int) -> float:
    """Forward FLOPs of one caption of `tokens` tokens (its padded length) through the encoder."""
    kind, layers, d, inner, _, matmul, _ = _shape(config)
    per_layer = 2 * matmul * tokens + 4 * tokens * tokens * inner
    head = 2 * d * _text_config(config)["projection_dim"] if kind == "clip" else 0  # the pooled projection
    return float(layers * per_layer + head)


def max_length(config: dict, asked: int) -> int:
    """The tokens a caption is padded to: data.text_max_length, else the kind's release default (CLIP: its positions)."""
    c = _text_config(config)
    return int(asked) if asked else _DEFAULT_LENGTH.get(c.get("model_type"), c.get("max_position_embeddings", 77))


def encodes_online(cfg) -> bool:
    """Whether training runs the text encoder: a captioned folder with `data.text_encoder`, not `dit extract` shards."""
    path = cfg.data.path
    return bool(cfg.data.text_encoder) and not (path and os.path.isfile(os.path.join(path, "manifest.json")))


def with_text_encoder(costs, cfg):
    """`costs` (a ModelCosts) with the online text encoder's weights (sharded under FSDP) and its forward per
    caption; `costs` itself when the captions come encoded."""
    if not encodes_online(cfg):
        return costs
    config = read_config(cfg.data.text_encoder)
    params = param_count(config)
    flops = forward_flops(config, max_length(config, cfg.data.text_max_length))
    # Per token of the image, divided by 3: the planner prices forward + backward as 3 forwards (as REPA's).
    return replace(costs, edge_flops=costs.edge_flops + flops / costs.tokens / 3,
                   sharded_frozen_bytes=costs.sharded_frozen_bytes + _DTYPE_BYTES[cfg.data.text_dtype] * params,
                   sharded_frozen_params=costs.sharded_frozen_params + params)
