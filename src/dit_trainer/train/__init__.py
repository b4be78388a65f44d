"""Training: the `DiTTrainer` (1..N processes), checkpointing it, metrics and `dit train`.

Names load on first use, so registering `dit train` (this package's `cli`) does not import torch.
"""

import importlib

_LAZY = {"DiTTrainer": "dit_trainer.train.trainer", "resolve_amp_dtype": "dit_trainer.train.backends"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dit_trainer.train' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["DiTTrainer", "resolve_amp_dtype"]
