"""dit-trainer: train and sample class-conditional Diffusion Transformers.

The main entry points are importable from the top level (loaded on first use, so `dit --help`
stays fast): `DiTTrainer` (the torch engine), `build_trainer` (the engine a config's `backend`
names), `get_spec`, `create_diffusion`, `build_config`.
"""

from dit_trainer.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "DiTTrainer": "dit_trainer.train",
    "build_trainer": "dit_trainer.train",
    "get_spec": "dit_trainer.models",
    "register_spec": "dit_trainer.models",
    "ModelSpec": "dit_trainer.models",
    "create_diffusion": "dit_trainer.diffusion",
    "Config": "dit_trainer.config",
    "build_config": "dit_trainer.config",
    "DiTPipeline": "dit_trainer.convert.pipeline",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = sorted(_LAZY)
