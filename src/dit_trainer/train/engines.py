"""The one Python entry that picks the engine a config names (`backend: torch | mindspore`)."""

from dit_trainer.config import backend_of
from dit_trainer.errors import ConfigError


def build_trainer(config, dataset=None):
    """The trainer of `config`'s backend: `DiTTrainer` (torch) or the MindSpore engine's
    `MindSporeTrainer`; both take `train_step(batch) -> {"loss": float}` and `train()`."""
    if backend_of(config) == "torch":
        from dit_trainer.train.trainer import DiTTrainer

        return DiTTrainer(config, dataset)
    try:
        from dit_trainer_mindspore import MindSporeTrainer
    except ImportError as err:
        raise ConfigError(f"backend mindspore needs MindSpore ({err}); pip install 'dit-trainer[mindspore]' "
                          "in an environment with numpy<2, or see scripts/mindspore_env.sh") from None
    if dataset is not None:
        raise ConfigError("backend mindspore reads its data from data.path; it takes no dataset object")
    return MindSporeTrainer(config)
