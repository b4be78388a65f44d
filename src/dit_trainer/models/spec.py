"""A registry of model specs, in the manner of torchtitan/HyperParallel: a name maps to how to
build the model and, beside it, how to parallelize, pipeline and convert it."""

import dataclasses
import difflib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dit_trainer.errors import ConfigError


@dataclass
class ModelSpec:
    """How to build one named model and the hooks that other stages attach to it."""

    name: str
    build_model_fn: Callable[[Any], Any]
    parallelize_fn: Optional[Callable] = None
    pipelining_fn: Optional[Callable] = None
    state_dict_adapter: Optional[Any] = None


_REGISTRY: dict[str, ModelSpec] = {}

# Fields of ModelConfig that are model constructor arguments.
MODEL_KWARGS = (
    "input_size", "in_channels", "num_classes", "learn_sigma", "class_dropout_prob",
    "depth", "hidden_size", "num_heads", "mlp_ratio",
)


def register_spec(name: str, spec: ModelSpec) -> None:
    """Add a spec under `name`; registering a name twice is an error."""
    if name in _REGISTRY:
        raise ValueError(f"model spec {name!r} is already registered; pick another name")
    _REGISTRY[name] = spec


def get_spec(name: str) -> ModelSpec:
    """The spec registered under `name`; an unknown name lists the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown model {name!r}{hint}; known models: {', '.join(_REGISTRY)}") from None


def list_specs() -> list[str]:
    """Names of every registered model."""
    return list(_REGISTRY)


def model_kwargs(cfg) -> dict:
    """Constructor arguments from a `Config`, a `ModelConfig` or a plain mapping.

    Mappings may use the ModelConfig field names; keys that are not constructor arguments
    (such as the RFC's `model_name` or `lr`) are ignored, missing ones keep the defaults.
    """
    if hasattr(cfg, "model") and not isinstance(cfg, Mapping):
        cfg = cfg.model
    if dataclasses.is_dataclass(cfg):
        cfg = dataclasses.asdict(cfg)
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"cannot build a model from {type(cfg).__name__}; pass a Config, ModelConfig or dict")
    return {k: cfg[k] for k in MODEL_KWARGS if k in cfg and cfg[k] is not None}


def lazy(target: str) -> Callable:
    """A function that imports `module:attr` on first call, so models never import parallel code."""
    module_name, attr = target.split(":")

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module_name), attr)(*args, **kwargs)

    call.__name__ = attr
    call.__qualname__ = target
    return call
