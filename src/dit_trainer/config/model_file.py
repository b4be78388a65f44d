"""A model config from a file: PaddleMIX's DiT JSON, or the `model:` section of our config.

One reader for every place that takes a model config: `dit train --config x.json`,
`model.config_file`, `dit convert --model x.json`, `dit sample --model x.json` and
`DiTPipeline.from_pretrained(..., model=...)`. Torch-free: `config.py` reads it and `dit --help`
must answer without torch.
"""

import json
from pathlib import Path

import yaml

from dit_trainer.config.paddlemix_json import is_paddlemix_config, model_config_from_paddlemix
from dit_trainer.errors import ConfigError
from dit_trainer.fs import check_regular
from dit_trainer.typed import yaml_problem

EXPECTED = ("our config (a mapping with a model: section, or a bare model section with name:) or a PaddleMIX "
            "DiT JSON (num_layers, num_attention_heads, attention_head_dim, or depth, hidden_size, patch_size)")


def is_model_file(value) -> bool:
    """Whether a `--model` value names a file rather than a registered name like DiT-XL/2."""
    text = str(value)
    return text.lower().endswith((".json", ".yaml", ".yml")) or Path(text).is_file()


def read_mapping(path) -> dict:
    """The mapping a JSON or YAML file holds (JSON by suffix, for JSON's own error messages)."""
    p = Path(path)
    check_regular(p, ConfigError, "a config file")
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist; pass a YAML or JSON file such as configs/demo_digits.yaml")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not text (byte {err.start} is not UTF-8); pass a YAML or JSON "
                          "file such as configs/demo_digits.yaml") from None
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read ({err.strerror or err})") from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except ValueError as err:  # json.JSONDecodeError
        raise ConfigError(f"config file {path} is not valid JSON: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} holds a {type(data).__name__}; expected {EXPECTED}")
    return data


def model_section(data: dict, path) -> dict:
    """Our `model:` section dict from a file's mapping: PaddleMIX's keys converted, ours taken as they are."""
    if is_paddlemix_config(data):
        return model_config_from_paddlemix(data, path)
    if isinstance(data.get("model"), dict):
        return dict(data["model"])
    if "name" in data:
        return dict(data)
    found = ", ".join(list(map(str, data))[:6]) or "nothing"
    raise ConfigError(f"model config file {path} holds {found}; expected {EXPECTED}")


def load_model_file(path) -> dict:
    """Our `model:` section dict from a PaddleMIX DiT JSON or a file of our config layout."""
    return model_section(read_mapping(path), path)
