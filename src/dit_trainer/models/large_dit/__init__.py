"""The Large-DiT family (DiT-LLaMA, Alpha-VLLM): model, options, parallel plan and state-dict
adapter, registered as `LargeDiT-<size>/2` and under the release's names (`DiT_Llama_<size>_patch2`).

Size fields can be overridden from `cfg.model` (`dim`, `n_layers`, `n_heads`, ...) to build small
members of the family for tests and demos. Registering imports no torch; the model loads on use.
"""

import importlib

from dit_trainer.lazy import lazy_exports
from dit_trainer.models.large_dit.config import LargeDiTConfig
from dit_trainer.models.large_dit.sizes import SIZES
from dit_trainer.models.large_dit.state_dict import LargeDiTStateDictAdapter
from dit_trainer.models.large_dit.weights_shape import weights_shape
from dit_trainer.models.spec import ModelSpec, register_spec

_MODEL = "dit_trainer.models.large_dit.model"
_LAZY = {
    **{name: _MODEL for name in ("DiT_Llama", "DiT_Llama_models", "DiT_Llama_600M_patch2", "DiT_Llama_3B_patch2",
                                 "DiT_Llama_7B_patch2", "build_large_dit")},
    "swiglu_hidden": "dit_trainer.models.large_dit.sizes",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def _build(size):
    def build(cfg):
        return importlib.import_module(_MODEL).build_large_dit(cfg, size)

    return build


def _costs(size):
    # The counts need swiglu_hidden from layers.py (torch): loaded when the planner asks.
    def costs(cfg):
        return importlib.import_module("dit_trainer.models.large_dit.costs").large_dit_costs(
            cfg, f"LargeDiT-{size}/2", SIZES[size])

    return costs


def _plan(name):
    # The plan imports torch.distributed; load it when a run asks for it, not with the model.
    def call(*args, **kwargs):
        return getattr(importlib.import_module("dit_trainer.models.large_dit.parallelize"), name)(*args, **kwargs)

    call.__name__ = name
    return call


def _train_flops(model, tokens_per_block=None) -> float:
    # torch.nn is loaded when a run counts, not with the registry.
    from dit_trainer.models.flops import train_flops_per_image

    return train_flops_per_image(model, tokens_per_block)


def _register():
    for size in SIZES:
        spec = ModelSpec(
            name=f"LargeDiT-{size}/2",
            family="large_dit",
            build_model_fn=_build(size),
            config_cls=LargeDiTConfig,
            parallelize_fn=_plan("parallelize_large_dit"),
            pipelining_fn=_plan("pipeline_large_dit"),
            state_dict_adapter=LargeDiTStateDictAdapter(),
            weights_shape_fn=weights_shape,
            costs_fn=_costs(size),
            flops_fn=_train_flops,
        )
        register_spec(spec.name, spec)
        register_spec(f"DiT_Llama_{size}_patch2", spec)


_register()

__all__ = [*_LAZY, "LargeDiTConfig", "LargeDiTStateDictAdapter", "SIZES"]
