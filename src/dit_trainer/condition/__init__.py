"""Conditioning as a value: what a model family is conditioned on, and its registry.

A model family's spec names its condition (`ModelSpec.condition`: "class" or "text");
`build_condition(cfg, spec, model)` builds it, and the trainer's step, sampling and export call its
methods (see `base.Condition` and docs/design.md, "conditions") instead of asking which kind it is.
Registering and naming conditions imports no torch; the implementations load when built.
"""

from dit_trainer.lazy import lazy_exports, register_target, resolve

_FACTORIES = {
    "class": "dit_trainer.condition.label:ClassCondition.from_config",
    "text": "dit_trainer.condition.text:TextCondition.from_config",
}
_LAZY = {"Condition": "base", "ClassCondition": "label", "TextCondition": "text", "CAPTION_KEYS": "text"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def register_condition(name: str, target: str) -> None:
    """Make `ModelSpec.condition == name` build with the factory at "module:attr", called as (cfg, model)."""
    register_target(_FACTORIES, name, target, "condition")


def list_conditions() -> list:
    """Names a model spec's `condition` may take."""
    return list(_FACTORIES)


def build_condition(cfg, spec, model=None):
    """The condition `spec.condition` names, built from the run's config and its model (the keyword
    arguments the model declares, its class count)."""
    name = getattr(spec, "condition", "class")
    if name not in _FACTORIES:
        raise ValueError(f"model {spec.name} names condition {name!r}, which is not one of {', '.join(_FACTORIES)}")
    return resolve(_FACTORIES[name])(cfg, model)


__all__ = [*_LAZY, "build_condition", "list_conditions", "register_condition"]
