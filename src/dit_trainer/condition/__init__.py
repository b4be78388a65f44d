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
# The config key of each condition's dropout share (its `Condition.dropout_key`), here so that torch-free
# callers (the layout planner) read it as the conditions do.
DROPOUT_KEYS = {"class": "model.class_dropout_prob", "text": "data.caption_dropout_prob"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def register_condition(name: str, target: str) -> None:
    """Make `ModelSpec.condition == name` build with the factory at "module:attr", called as (cfg, model)."""
    register_target(_FACTORIES, name, target, "condition")


def list_conditions() -> list:
    """Names a model spec's `condition` may take."""
    return list(_FACTORIES)


def dropout_prob(cfg, name: str) -> float:
    """The dropout share condition `name` trains with in `cfg` (a registered condition without an entry in
    DROPOUT_KEYS: the class labels')."""
    section, key = DROPOUT_KEYS.get(name, DROPOUT_KEYS["class"]).split(".")
    return getattr(getattr(cfg, section), key)


def build_condition(cfg, spec, model=None):
    """The condition `spec.condition` names, built from the run's config and its model (the keyword
    arguments the model declares, its class count)."""
    name = getattr(spec, "condition", "class")
    if name not in _FACTORIES:
        raise ValueError(f"model {spec.name} names condition {name!r}, which is not one of {', '.join(_FACTORIES)}")
    return resolve(_FACTORIES[name])(cfg, model)


__all__ = [*_LAZY, "DROPOUT_KEYS", "build_condition", "dropout_prob", "list_conditions", "register_condition"]
