"""The Large-DiT family (DiT-LLaMA, Alpha-VLLM): model, options, parallel plan and state-dict
adapter, registered as `LargeDiT-<size>/2` and under the release's names (`DiT_Llama_<size>_patch2`).

Size fields can be overridden from `cfg.model` (`dim`, `n_layers`, `n_heads`, ...) to build small
members of the family for tests and demos.
"""

from dit_trainer.models.large_dit.config import LargeDiTConfig, check_sizes
from dit_trainer.models.large_dit.costs import large_dit_costs
from dit_trainer.models.large_dit.layers import swiglu_hidden
from dit_trainer.models.large_dit.model import DiT_Llama
from dit_trainer.models.large_dit.state_dict import LargeDiTStateDictAdapter
from dit_trainer.models.spec import ModelSpec, build_kwargs, register_spec

# (dim, n_layers, n_heads) of the release's three sizes, all with 2×2 patches.
SIZES = {"600M": (1536, 16, 32), "3B": (3072, 32, 32), "7B": (4096, 32, 32)}


def _constructor(size, patch=2):
    dim, n_layers, n_heads = SIZES[size]

    def build(**kwargs):
        return DiT_Llama(**{"patch_size": patch, "dim": dim, "n_layers": n_layers, "n_heads": n_heads, **kwargs})

    build.__name__ = f"DiT_Llama_{size}_patch{patch}"
    build.__doc__ = f"LargeDiT-{size}/{patch}: dim {dim}, {n_layers} layers, {n_heads} heads, patch {patch}."
    return build


DiT_Llama_models = {f"LargeDiT-{size}/2": _constructor(size) for size in SIZES}
DiT_Llama_600M_patch2 = DiT_Llama_models["LargeDiT-600M/2"]
DiT_Llama_3B_patch2 = DiT_Llama_models["LargeDiT-3B/2"]
DiT_Llama_7B_patch2 = DiT_Llama_models["LargeDiT-7B/2"]


def build_large_dit(cfg, size):
    """A DiT_Llama of `size` from a Config, a ModelConfig or a mapping (family keys override)."""
    shared, family = build_kwargs(cfg, LargeDiTConfig)
    options = dict(vars(family))
    for key, value in zip(("dim", "n_layers", "n_heads"), SIZES[size]):
        if options[key] is None:  # None keeps the named size's value
            options[key] = value
    check_sizes(options["dim"], options["n_heads"], options["n_kv_heads"])
    return DiT_Llama(**shared, **options)


def _plan(name):
    # The plan imports torch.distributed; load it when a run asks for it, not with the model.
    def call(*args, **kwargs):
        from dit_trainer.models.large_dit import parallelize

        return getattr(parallelize, name)(*args, **kwargs)

    call.__name__ = name
    return call


def _register():
    for size in SIZES:
        spec = ModelSpec(
            name=f"LargeDiT-{size}/2",
            family="large_dit",
            build_model_fn=lambda cfg, size=size: build_large_dit(cfg, size),
            config_cls=LargeDiTConfig,
            parallelize_fn=_plan("parallelize_large_dit"),
            pipelining_fn=_plan("pipeline_large_dit"),
            state_dict_adapter=LargeDiTStateDictAdapter(),
            costs_fn=lambda cfg, size=size: large_dit_costs(cfg, f"LargeDiT-{size}/2", SIZES[size]),
        )
        register_spec(spec.name, spec)
        register_spec(f"DiT_Llama_{size}_patch2", spec)


_register()

__all__ = [
    "DiT_Llama",
    "DiT_Llama_models",
    "DiT_Llama_600M_patch2",
    "DiT_Llama_3B_patch2",
    "DiT_Llama_7B_patch2",
    "LargeDiTConfig",
    "LargeDiTStateDictAdapter",
    "SIZES",
    "build_large_dit",
    "swiglu_hidden",
]
