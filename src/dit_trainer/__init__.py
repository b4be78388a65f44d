"""dit-trainer: train and sample class-conditional Diffusion Transformers.

The main entry points are importable from the top level (loaded on first use, so `dit --help`
stays fast): `DiTTrainer`, `get_spec`, `create_diffusion`, `load_config`.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "DiTTrainer": "dit_trainer.train",
    "get_spec": "dit_trainer.models",
    "register_spec": "dit_trainer.models",
    "ModelSpec": "dit_trainer.models",
    "create_diffusion": "dit_trainer.diffusion",
    "Config": "dit_trainer.config",
    "load_config": "dit_trainer.config",
    "DiTPipeline": "dit_trainer.convert.pipeline",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dit_trainer' has no attribute {name!r}")


def __dir__():
    # The lazy names are what a user looks for; list them beside the module's own attributes.
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
