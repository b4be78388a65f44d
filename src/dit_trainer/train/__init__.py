"""Training: the `DiTTrainer` (1..N processes), checkpointing it, metrics and `dit train`."""

from dit_trainer.train.trainer import DiTTrainer, resolve_amp_dtype

__all__ = ["DiTTrainer", "resolve_amp_dtype"]
