"""The SiT family: DiT's backbone for interpolant transport, registered as model specs."""

from dit_trainer.models.sit.model import SiT, SiT_models
from dit_trainer.models.spec import ModelSpec, lazy, model_kwargs, register_spec


def _register_sit():
    # Same hooks as DiT's: the backbone, its block names and its embed/blocks/head split are DiT's.
    for name, ctor in SiT_models.items():
        register_spec(
            name,
            ModelSpec(
                name=name,
                build_model_fn=lambda cfg, ctor=ctor: ctor(**model_kwargs(cfg)),
                parallelize_fn=lazy("dit_trainer.parallel.parallelize:parallelize_dit"),
                pipelining_fn=lazy("dit_trainer.parallel.pipeline:pipeline_dit"),
            ),
        )


_register_sit()

__all__ = ["SiT", "SiT_models"]
