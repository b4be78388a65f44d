"""MindSpore backend of dit-trainer (`pip install dit-trainer[mindspore]`): DiT as mindspore.nn
Cells with our parameter names, the Gaussian diffusion loss, a GeneratorDataset over our latent
formats, and the train step behind `DiTTrainer({"backend": "mindspore", ...})`.

Imports no torch: it shares only dit_trainer's config, errors, size table and beta schedules.
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "MindSporeEngine": "dit_trainer_mindspore.engine",
    "DiT": "dit_trainer_mindspore.model",
    "GaussianDiffusion": "dit_trainer_mindspore.diffusion",
    "build_dataset": "dit_trainer_mindspore.data",
    "open_source": "dit_trainer_mindspore.data",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = sorted(_LAZY)
