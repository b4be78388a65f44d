"""Model families and the registry that finds them by name."""

from dit_trainer.models.dit import DiT, DiT_models, DiTBlock, FinalLayer, LabelEmbedder, TimestepEmbedder, modulate
from dit_trainer.models.spec import ModelSpec, get_spec, list_specs, model_kwargs, register_spec


def _register_dit():
    from dit_trainer.models.spec import lazy

    for name, ctor in DiT_models.items():
        register_spec(
            name,
            ModelSpec(
                name=name,
                build_model_fn=lambda cfg, ctor=ctor: ctor(**model_kwargs(cfg)),
                parallelize_fn=lazy("dit_trainer.parallel.parallelize:parallelize_dit"),
                pipelining_fn=lazy("dit_trainer.parallel.pipeline:pipeline_dit"),
            ),
        )


_register_dit()

import dit_trainer.models.large_dit  # noqa: E402,F401  registers the Large-DiT specs

__all__ = [
    "DiT",
    "DiT_models",
    "DiTBlock",
    "FinalLayer",
    "LabelEmbedder",
    "TimestepEmbedder",
    "modulate",
    "ModelSpec",
    "get_spec",
    "list_specs",
    "model_kwargs",
    "register_spec",
]
