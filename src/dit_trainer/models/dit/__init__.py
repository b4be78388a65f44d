"""The DiT family (Peebles & Xie, 2023): model, options, parallel plan and state-dict adapter,
registered under the release's names ("DiT-XL/2", ...).

Registering imports no torch: each spec builds its model (and counts its FLOPs) by importing
`model.py` when first asked, so a config can be checked, and `objective: auto` resolved, without
torch (the MindSpore backend does both). The model's classes load on first use too.
"""

import importlib

from dit_trainer.lazy import lazy_exports
from dit_trainer.models.dit.config import DiTConfig
from dit_trainer.models.dit.costs import dit_costs
from dit_trainer.models.dit.sizes import PATCHES, SIZES
from dit_trainer.models.dit.state_dict import DiTStateDictAdapter
from dit_trainer.models.dit.weights_shape import weights_shape
from dit_trainer.models.spec import ModelSpec, build_kwargs, register_spec
from dit_trainer.objective import takes_guidance_scale, takes_interval
from dit_trainer.repa.attach import attach_projector

_MODEL = "dit_trainer.models.dit.model"
_CONSTRUCTORS = [f"DiT_{size}_{patch}" for size in SIZES for patch in PATCHES]
_LAZY = {
    **{name: _MODEL for name in ("DiT", "DiT_models", "DiTBlock", "FinalLayer", "LabelEmbedder", "TimestepEmbedder",
                                 "modulate", *_CONSTRUCTORS)},
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def _builder(table: str, name: str):
    module, _, attr = table.partition(":")

    def build(cfg):
        ctor = getattr(importlib.import_module(module), attr)[name]
        shared, family = build_kwargs(cfg, DiTConfig)
        sizes = {k: v for k, v in vars(family).items() if v is not None}
        return attach_projector(ctor(**shared, **sizes, interval_embedding=takes_interval(cfg),
                                     guidance_embedding=takes_guidance_scale(cfg)), cfg)

    return build


def _lazy_call(module: str, name: str):
    # The plan imports torch.distributed and the FLOP count torch.nn: load them when a run asks.
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = name
    return call


def register_family(prefix: str, table: str, family: str, objective: str = "diffusion") -> None:
    """Register "{prefix}-{S,B,L,XL}/{2,4,8}", built from the constructor dict `table`
    ("module:attr"), for a family on DiT's backbone (DiT itself, SiT)."""
    plan = "dit_trainer.models.dit.parallelize"
    for size in SIZES:
        for patch in PATCHES:
            name = f"{prefix}-{size}/{patch}"
            register_spec(
                name,
                ModelSpec(
                    name=name,
                    family=family,
                    build_model_fn=_builder(table, name),
                    config_cls=DiTConfig,
                    parallelize_fn=_lazy_call(plan, "parallelize_dit"),
                    pipelining_fn=_lazy_call(plan, "pipeline_dit"),
                    state_dict_adapter=DiTStateDictAdapter(),
                    flops_fn=_lazy_call("dit_trainer.models.flops", "train_flops_per_image"),
                    objective=objective,
                    weights_shape_fn=weights_shape,
                    costs_fn=lambda cfg, name=name: dit_costs(cfg, name),
                ),
            )


register_family("DiT", f"{_MODEL}:DiT_models", "dit")

__all__ = [*_LAZY, "DiTConfig", "DiTStateDictAdapter", "register_family"]
