"""A registry of model specs, in the manner of torchtitan/HyperParallel: a name maps to how to
build the model and, beside it, how to parallelize, pipeline and convert it."""

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dit_trainer.errors import ConfigError
from dit_trainer.typed import build_dataclass, closest_key_error, closest_name

# The model-config fields every family's constructor takes (the rest are the family's options).
SHARED_FIELDS = ("input_size", "in_channels", "num_classes", "learn_sigma", "class_dropout_prob")


@dataclass
class ModelSpec:
    """How to build one named model and the hooks that other stages attach to it.

    `build_model_fn(cfg)` takes a `Config`, a `ModelConfig` or a mapping. `config_cls` is the
    family's dataclass of its own options. `parallelize_fn(model, dims, cfg, param_dtype)` and
    `pipelining_fn(model, dims, cfg, loss_fn, device, parallelize_fn)` are the family's parallel
    plan (see docs/design.md); `clip_grad_fn(parameters, max_norm, pp_group)` clips gradients;
    `state_dict_adapter` maps weights to and from released checkpoints; `flops_fn(model)` gives
    the training FLOPs of one image (for MFU); `costs_fn(cfg)` gives the counts the layout planner
    prices (`models.costs.ModelCosts`: parameters, work and saved activations per block, no model
    built); `objective` is what `objective: auto` trains it with; `weights_shape_fn` reads the
    model keys off a state dict, `label_embedding` names the class table; `condition` names what
    the model is conditioned on (`dit_trainer.condition`: "class" labels or "text" captions);
    `adopt_weights_fn(model, state_dict, source, log)` turns another family's weights of the same
    shape into a full state dict of `model` (a PixArt from a DiT).
    """

    name: str
    build_model_fn: Callable[[Any], Any]
    family: str = ""
    config_cls: Optional[type] = None
    parallelize_fn: Optional[Callable] = None
    pipelining_fn: Optional[Callable] = None
    clip_grad_fn: Optional[Callable] = None
    state_dict_adapter: Optional[Any] = None
    flops_fn: Optional[Callable] = None  # model -> training FLOPs per image (forward + backward), for MFU
    costs_fn: Optional[Callable] = None  # model config -> ModelCosts, for `dit plan` and `parallel.layout auto`
    objective: str = "diffusion"  # the objective its releases were trained with (`objective: auto`)
    # (state_dict in our names, model.name or None, the family options set, source) -> the model keys
    # those weights need: what `model.weights_path` fills in (see train/pretrained.py)
    weights_shape_fn: Optional[Callable] = None
    label_embedding: str = "y_embedder.embedding_table.weight"  # the table a new class count starts anew
    condition: str = "class"  # what the model is conditioned on: class | text (dit_trainer.condition)
    adopt_weights_fn: Optional[Callable] = None  # (model, state_dict, source, log) -> model's full state dict
    text_max_length: int = 0  # caption tokens its release was trained on (data.text_max_length 0 takes it); 0: the encoder's

    def from_released(self, state_dict: dict) -> dict:
        """A state dict in the family's released names (or a wrapped training copy) in ours."""
        return self.state_dict_adapter.from_released(state_dict) if self.state_dict_adapter else dict(state_dict)


_REGISTRY: dict[str, ModelSpec] = {}


def register_spec(name: str, spec: ModelSpec) -> None:
    """Add a spec under `name`; registering a name twice is an error."""
    if name in _REGISTRY:
        raise ValueError(f"model spec {name!r} is already registered; pick another name")
    _REGISTRY[name] = spec


def _lookup(name: str) -> Optional[ModelSpec]:
    _load_families()
    if name in _REGISTRY:
        return _REGISTRY[name]
    folded = {k.lower(): v for k, v in _REGISTRY.items()}
    return folded.get(str(name).lower())


def get_spec(name: str) -> ModelSpec:
    """The spec registered under `name` (case-insensitive); an unknown name lists the known ones."""
    spec = _lookup(name)
    if spec is None:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown model {name!r}{hint}; known models: {', '.join(_REGISTRY)}")
    return spec


def release_objective(name: str) -> str:
    """The objective model `name` was released with (`objective: auto`); diffusion for unknown names."""
    spec = _lookup(name)
    return spec.objective if spec is not None else "diffusion"


def objective_fits(name: str, objective: str, learn_sigma: bool) -> None:
    """A one-line error where `objective` cannot train model `name` (a SiT head under DDPM's learned sigma)."""
    spec = _lookup(name)
    if spec is not None and spec.objective == "transport" and objective == "diffusion" and learn_sigma:
        raise ConfigError(f"model.name {spec.name} returns only its prediction channels, but objective diffusion with "
                          "model.learn_sigma true also needs the variance ones: set objective transport (or auto), "
                          f"model.learn_sigma false, or model.name {spec.name.replace('SiT', 'DiT', 1)}")


def list_specs() -> list[str]:
    """Names of every registered model."""
    _load_families()
    return list(_REGISTRY)


def registered_specs() -> dict[str, ModelSpec]:
    """Every registered model, name -> spec, in registration order (a copy)."""
    _load_families()
    return dict(_REGISTRY)


def _load_families() -> None:
    # Families register themselves on import; importing the models package imports them all.
    import dit_trainer.models  # noqa: F401


def _model_section(cfg) -> Mapping:
    """The model section of a `Config`, a `ModelConfig` or a mapping, as a flat mapping."""
    if hasattr(cfg, "model") and not isinstance(cfg, Mapping):
        cfg = cfg.model
    if dataclasses.is_dataclass(cfg):
        d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        d.update(d.pop("options", None) or {})
        return d
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"cannot build a model from {type(cfg).__name__}; pass a Config, ModelConfig or dict")
    d = dict(cfg)
    d.update(d.pop("options", None) or {})
    return d


def family_options(name: str, options: Mapping, model=None, elsewhere=()) -> dict:
    """`options` typed and checked against the family config of model `name` (unknown names pass).

    A family config with a `check(name, model)` method also checks the values, given the model
    section `model` (its shared fields such as `input_size`). `elsewhere`: the dotted keys of the
    other config sections, so an unknown option can point at one (`model.learning_rate` is optim.lr).
    """
    spec = _lookup(name)
    if spec is None or spec.config_cls is None:
        return dict(options)
    own = [f.name for f in dataclasses.fields(spec.config_cls)]
    for key in options:
        if key not in own:
            # A typo of a shared field ("nmae") should point there, not at the family's options.
            candidates = ["name", *SHARED_FIELDS, "weights_path", "config_file", *own]
            mine = [f"model.{c}" for c in candidates]
            raise _other_family_error(key, spec, candidates) or closest_key_error(
                f"model.{key}", [*mine, *elsewhere], listed=mine)
    typed = build_dataclass(spec.config_cls, dict(options), prefix="model.")
    if model is not None and hasattr(typed, "check"):
        typed.check(spec.name, model)
    return {k: getattr(typed, k) for k in options}


def _family_label(family: str) -> str:
    """A family as users know it: its first registered name's stem (DiT, LargeDiT)."""
    names = [n for n, s in _REGISTRY.items() if s.family == family]
    return names[0].split("-")[0] if names else family


def _other_family_error(key: str, spec: ModelSpec, candidates) -> Optional[ConfigError]:
    """When `key` is another family's option (`n_layers` on a DiT), an error naming that family and
    this one's counterpart (`depth`); None when no other family has it."""
    for other in _REGISTRY.values():
        if other.config_cls is None or other.family == spec.family:
            continue
        if key in {f.name for f in dataclasses.fields(other.config_cls)}:
            mine = _family_label(spec.family)
            close = closest_name(key, candidates)
            hint = f"{mine}'s is 'model.{close}'" if close else f"{spec.name} has no such option"
            return ConfigError(f"model.{key} is a {_family_label(other.family)} key; {hint}")
    return None


def build_kwargs(cfg, config_cls) -> tuple[dict, Any]:
    """(shared constructor arguments, the family's config dataclass) from any model config form.

    Mapping keys that belong to neither (such as the RFC's `model_name` or `lr`) are ignored,
    missing ones keep the defaults.
    """
    section = _model_section(cfg)
    shared = {k: section[k] for k in SHARED_FIELDS if section.get(k) is not None}
    names = {f.name for f in dataclasses.fields(config_cls)}
    family = build_dataclass(config_cls, {k: v for k, v in section.items() if k in names}, prefix="model.")
    return shared, family


def options_from_weights(want: dict, implied: dict, options: dict, source, name=None, fits: str = "") -> dict:
    """The family options a model needs for weights of shape `want` (option -> value), where the name
    alone implies `implied`; a value the user set in `options`, or the model.name `name` they set,
    that the weights contradict is a one-line ConfigError (`fits`: the model the tensors make)."""
    out = {}
    for key, value in want.items():
        user = options.get(key)
        if user is not None and user != value:
            raise ConfigError(f"model.{key} is {user} but {source} holds {value}; leave model.{key} out "
                              "(the weights decide it)")
        if user is None and implied.get(key) != value:
            if name is not None:  # the name the user set stands for its size's value
                raise ConfigError(f"model.name {name} does not fit {source}: its {key} is {implied.get(key)}, the "
                                  f"tensors' {value}{f' (a {fits})' if fits else ''}; leave model.name out (the weights decide it) or set "
                                  f"model.{key} {value} beside it")
            out[key] = value
    return out
