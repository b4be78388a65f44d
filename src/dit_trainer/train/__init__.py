"""Training: the `DiTTrainer` (1..N processes), its step, checkpoints and resume, metrics, and
`dit train`; `build_trainer(config)` returns the trainer of the engine the config names.

Names load on first use, so registering `dit train` (this package's `cli`) does not import torch.
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {"DiTTrainer": "dit_trainer.train.trainer", "build_trainer": "dit_trainer.train.engines",
         "resolve_amp_dtype": "dit_trainer.train.choices"}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = ["DiTTrainer", "build_trainer", "resolve_amp_dtype"]
