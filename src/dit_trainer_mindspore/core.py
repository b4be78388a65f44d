"""What this backend takes from dit_trainer's torch-free core: the checked config, and the MindSpore
DiT's constructor arguments from it (the DiT size table is `dit_trainer.models.dit.sizes`)."""

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.models.dit.config import block_options, refuse_block_options
from dit_trainer.models.dit.sizes import NAMES, dit_size


def mindspore_config(config):
    """`build_config(config)` (no torch imported), refused for a model without a MindSpore build."""
    cfg = build_config(config)
    if cfg.model.name not in NAMES:
        raise ConfigError(f"model.name {cfg.model.name!r} has no MindSpore build; use one of {', '.join(NAMES)}")
    refuse_block_options(block_options(cfg.model.options), "backend mindspore", cfg.model.name,
                         "train it with backend torch, or leave those options out")
    return cfg


def model_kwargs(cfg) -> dict:
    """Constructor arguments of the MindSpore DiT for `cfg.model` (named size plus overrides)."""
    m = cfg.model
    opts = {k: v for k, v in m.options.items() if v is not None}
    return {**dit_size(m.name), **opts, "input_size": m.input_size, "in_channels": m.in_channels,
            "num_classes": m.num_classes, "learn_sigma": m.learn_sigma, "class_dropout_prob": m.class_dropout_prob}
