"""Model families and the registry that finds them by name.

Each family is a folder that registers its specs when imported; adding a family is its folder
plus one name in `FAMILIES`. Registering imports no torch (a spec builds its model on first use),
so reading and checking a config, and `dit --help`, stay torch-free; the model classes below load
on first use.
"""

import importlib

from dit_trainer.lazy import lazy_exports
from dit_trainer.models.spec import ModelSpec, get_spec, list_specs, register_spec

FAMILIES = (
    "dit_trainer.models.dit",
    "dit_trainer.models.sit",
    "dit_trainer.models.large_dit",
    "dit_trainer.models.pixart",
)
for _family in FAMILIES:
    importlib.import_module(_family)

_DIT = "dit_trainer.models.dit.model"
_LAZY = {
    **{name: _DIT for name in ("DiT", "DiT_models", "DiTBlock", "FinalLayer", "LabelEmbedder", "TimestepEmbedder",
                               "modulate")},
    "SiT": "dit_trainer.models.sit.model", "SiT_models": "dit_trainer.models.sit.model",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [*_LAZY, "FAMILIES", "ModelSpec", "get_spec", "list_specs", "register_spec"]
