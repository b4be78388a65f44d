"""MindSpore backend of dit-trainer (`pip install dit-trainer[mindspore]`): DiT as mindspore.nn
Cells with our parameter names, the Gaussian diffusion loss, a GeneratorDataset over our latent
formats, and the train step behind `DiTTrainer({"backend": "mindspore", ...})`.

Imports no torch: it shares only dit_trainer's config, errors, size table and beta schedules.
"""

import importlib

_LAZY = {
    "MindSporeEngine": "dit_trainer_mindspore.engine",
    "DiT": "dit_trainer_mindspore.model",
    "GaussianDiffusion": "dit_trainer_mindspore.diffusion",
    "build_dataset": "dit_trainer_mindspore.data",
    "open_source": "dit_trainer_mindspore.data",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dit_trainer_mindspore' has no attribute {name!r}")


__all__ = sorted(_LAZY)
