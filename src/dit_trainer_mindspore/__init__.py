"""MindSpore backend of dit-trainer (`pip install dit-trainer[mindspore]`): DiT as mindspore.nn
Cells with our parameter names, the Gaussian diffusion loss, a GeneratorDataset over our latent
formats, and `MindSporeTrainer`, which `dit_trainer.build_trainer({"backend": "mindspore", ...})` and
`dit train` return for that backend.

Imports no torch: it shares dit_trainer's torch-free core (config, errors, the DiT size table, the
beta schedules, label files).
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "MindSporeTrainer": "dit_trainer_mindspore.engine",
    "DiT": "dit_trainer_mindspore.model",
    "GaussianDiffusion": "dit_trainer_mindspore.diffusion",
    "build_dataset": "dit_trainer_mindspore.data",
    "open_source": "dit_trainer_mindspore.data",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = sorted(_LAZY)
