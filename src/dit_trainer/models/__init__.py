"""Model families and the registry that finds them by name.

Each family is a folder that registers its specs when imported; adding a family is its folder
plus one name in `FAMILIES`.
"""

import importlib

from dit_trainer.models.spec import ModelSpec, get_spec, list_specs, register_spec

FAMILIES = (
    "dit_trainer.models.dit",
    "dit_trainer.models.sit",
    "dit_trainer.models.large_dit",
)
for _family in FAMILIES:
    importlib.import_module(_family)

from dit_trainer.models.dit import DiT, DiT_models, DiTBlock, FinalLayer, LabelEmbedder, TimestepEmbedder, modulate  # noqa: E402

from dit_trainer.models.sit import SiT, SiT_models  # noqa: E402

__all__ = [
    "DiT",
    "DiT_models",
    "SiT",
    "SiT_models",
    "DiTBlock",
    "FinalLayer",
    "LabelEmbedder",
    "TimestepEmbedder",
    "modulate",
    "FAMILIES",
    "ModelSpec",
    "get_spec",
    "list_specs",
    "register_spec",
]
