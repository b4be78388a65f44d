"""The DiT family (Peebles & Xie, 2023): model, options, parallel plan and state-dict adapter,
registered under the release's names ("DiT-XL/2", ...)."""

from dit_trainer.models.dit.config import DiTConfig
from dit_trainer.models.dit.costs import dit_costs
from dit_trainer.models.dit.flops import dit_train_flops_per_image
from dit_trainer.models.dit.model import (  # noqa: F401 (the release's constructor names are public)
    DiT,
    DiT_B_2,
    DiT_B_4,
    DiT_B_8,
    DiT_L_2,
    DiT_L_4,
    DiT_L_8,
    DiT_models,
    DiT_S_2,
    DiT_S_4,
    DiT_S_8,
    DiT_XL_2,
    DiT_XL_4,
    DiT_XL_8,
    DiTBlock,
    FinalLayer,
    LabelEmbedder,
    TimestepEmbedder,
    modulate,
)
from dit_trainer.models.dit.state_dict import DiTStateDictAdapter
from dit_trainer.models.spec import ModelSpec, build_kwargs, register_spec


def _builder(ctor):
    def build(cfg):
        shared, family = build_kwargs(cfg, DiTConfig)
        sizes = {k: v for k, v in vars(family).items() if v is not None}
        return ctor(**shared, **sizes)

    return build


def _plan(name):
    # The plan imports torch.distributed; load it when a run asks for it, not with the model.
    def call(*args, **kwargs):
        from dit_trainer.models.dit import parallelize

        return getattr(parallelize, name)(*args, **kwargs)

    call.__name__ = name
    return call


def register_family(constructors: dict, family: str, objective: str = "diffusion") -> None:
    """Register one spec per constructor name (shared by families built on DiT's backbone)."""
    for name, ctor in constructors.items():
        register_spec(
            name,
            ModelSpec(
                name=name,
                family=family,
                build_model_fn=_builder(ctor),
                config_cls=DiTConfig,
                parallelize_fn=_plan("parallelize_dit"),
                pipelining_fn=_plan("pipeline_dit"),
                state_dict_adapter=DiTStateDictAdapter(),
                flops_fn=dit_train_flops_per_image,
                costs_fn=lambda cfg, name=name: dit_costs(cfg, name),
                objective=objective,
            ),
        )


register_family(DiT_models, "dit")

__all__ = ["DiT", "DiT_models", "DiTBlock", "DiTConfig", "DiTStateDictAdapter", "FinalLayer", "LabelEmbedder",
           "TimestepEmbedder", "modulate", "register_family"]
