"""Training: the `DiTTrainer` (1..N processes), checkpointing it, metrics and `dit train`.

Names load on first use, so registering `dit train` (this package's `cli`) does not import torch.
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {"DiTTrainer": "dit_trainer.train.trainer", "resolve_amp_dtype": "dit_trainer.train.backends"}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = ["DiTTrainer", "resolve_amp_dtype"]
