"""The torch-free core of dit_trainer that this backend shares: config, errors, sizes, schedules.

`dit_trainer.config`, `dit_trainer.config.typed` and `dit_trainer.errors` import no torch. The DiT size
table (`models/dit/sizes.py`) and the beta schedules (`diffusion/schedules.py`) are torch-free
files too, but their packages' `__init__` import the PyTorch model and diffusion; `leaf()` loads
such a file on its own so that this backend runs where torch is not installed.
"""

import dataclasses
import importlib.util
import os
import sys

import dit_trainer
from dit_trainer.config import RFC_KEYS, Config, _flatten, set_key
from dit_trainer.errors import ConfigError

_ROOT = os.path.dirname(os.path.abspath(dit_trainer.__file__))


def leaf(module: str):
    """Module `dit_trainer.<...>` (a torch-free file) without running its packages' `__init__`."""
    if module in sys.modules:
        return sys.modules[module]
    path = os.path.join(_ROOT, *module.split(".")[1:]) + ".py"
    private = "_dit_trainer_mindspore_leaf." + module
    if private not in sys.modules:
        spec = importlib.util.spec_from_file_location(private, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[private] = mod
    return sys.modules[private]


def sizes():
    """`dit_trainer.models.dit.sizes`: the DiT size table."""
    return leaf("dit_trainer.models.dit.sizes")


def schedules():
    """`dit_trainer.diffusion.schedules`: the float64 beta schedules."""
    return leaf("dit_trainer.diffusion.schedules")


def as_config(config) -> Config:
    """A Config from a Config, or a nested/RFC flat dict, without importing torch.

    `dit_trainer.config.config_from_dict` validates family options through the (torch) model
    registry; here the DiT options are checked against `DiTConfig`'s fields directly.
    """
    if isinstance(config, Config):
        cfg = config
    elif isinstance(config, dict):
        cfg = Config()
        for key, value in _flatten(config).items():
            set_key(cfg, RFC_KEYS.get(key, key), value)
    else:
        raise ConfigError(f"cannot read a config from {type(config).__name__}; pass a Config or a dict")
    dit_fields = {f.name for f in dataclasses.fields(leaf("dit_trainer.models.dit.config").DiTConfig)}
    unknown = sorted(set(cfg.model.options) - dit_fields)
    if unknown:
        raise ConfigError(f"model option {unknown[0]!r} is not a DiT option; use one of {', '.join(sorted(dit_fields))}")
    if cfg.objective == "auto":
        cfg.objective = "diffusion"  # what `auto` gives a DiT, the one family this backend builds
    return cfg


def model_kwargs(cfg: Config) -> dict:
    """Constructor arguments of the MindSpore DiT for `cfg.model` (named size plus overrides)."""
    m = cfg.model
    try:
        size = sizes().dit_size(m.name)
    except KeyError:
        names = ", ".join(sizes().NAMES)
        raise ConfigError(f"model.name {m.name!r} has no MindSpore build; use one of {names}") from None
    opts = {k: v for k, v in m.options.items() if v is not None}
    return {**size, **opts, "input_size": m.input_size, "in_channels": m.in_channels,
            "num_classes": m.num_classes, "learn_sigma": m.learn_sigma, "class_dropout_prob": m.class_dropout_prob}
