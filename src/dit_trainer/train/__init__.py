"""Training: the `DiTTrainer`, EMA, checkpoints and data feeding."""

from dit_trainer.train.trainer import DiTTrainer, build_diffusion

__all__ = ["DiTTrainer", "build_diffusion"]
