"""The PixArt family (PixArt-alpha and PixArt-Sigma): model, options, parallel plan, state-dict adapter
and start from a DiT, registered as `PixArt-{alpha,Sigma}-XL/2-{256,512,1024}` and under the Hugging Face
repositories' names (`PixArt-XL-2-1024-MS`, `PixArt-Sigma-XL-2-512-MS`, ...).

Text-conditioned (`condition="text"`): trained on captioned data, a dropped caption replaced by the
encoding of "". Registering imports no torch; the model loads on first use.
"""

import importlib

from dit_trainer.errors import ConfigError
from dit_trainer.lazy import lazy_exports
from dit_trainer.models.pixart.config import PixArtConfig
from dit_trainer.models.pixart.costs import pixart_costs
from dit_trainer.models.pixart.sizes import HUB_NAMES, RELEASES
from dit_trainer.models.pixart.state_dict import PixArtStateDictAdapter
from dit_trainer.models.pixart.weights_shape import weights_shape
from dit_trainer.models.spec import ModelSpec, build_kwargs, register_spec
from dit_trainer.objective import takes_guidance_scale, takes_interval
from dit_trainer.repa.attach import attach_projector

_MODEL = "dit_trainer.models.pixart.model"
_LAZY = {name: _MODEL for name in ("PixArt", "PixArtBlock", "MultiHeadCrossAttention", "T2IFinalLayer",
                                   "CaptionEmbedder", "SizeEmbedder")}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def _refuse_unsupported(cfg, name: str) -> None:
    """Training options PixArt's blocks do not take, each refused in one line."""
    train = getattr(cfg, "train", None)
    if train is not None and getattr(train, "routing_keep", 1.0) < 1:
        raise ConfigError(f"train.routing_keep < 1 (token routing) is not supported by {name}, whose blocks also "
                          "read the caption; set train.routing_keep 1")


def _builder(name: str):
    def build(cfg):
        _refuse_unsupported(cfg, name)
        shared, options = build_kwargs(cfg, PixArtConfig)
        module = importlib.import_module(_MODEL)
        model = module.build_pixart(options.resolved(name), shared.get("input_size", 32),
                                    shared.get("in_channels", 4), shared.get("learn_sigma", True),
                                    interval_embedding=takes_interval(cfg), guidance_embedding=takes_guidance_scale(cfg))
        return attach_projector(model, cfg)

    return build


def _lazy_call(module: str, attr: str):
    # The plan imports torch.distributed, adoption torch: loaded when a run asks.
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.__name__ = attr
    return call


def _register():
    for r in RELEASES:
        spec = ModelSpec(
            name=r.name,
            family="pixart",
            build_model_fn=_builder(r.name),
            config_cls=PixArtConfig,
            parallelize_fn=_lazy_call("dit_trainer.models.pixart.parallelize", "parallelize_pixart"),
            pipelining_fn=None,  # refused in one line by the trainer: every block reads the caption
            state_dict_adapter=PixArtStateDictAdapter(),
            costs_fn=lambda cfg, name=r.name: pixart_costs(cfg, name),
            weights_shape_fn=weights_shape,
            condition="text",
            adopt_weights_fn=_lazy_call("dit_trainer.models.pixart.adopt", "adopt_weights"),
            text_max_length=r.text_max_length,
        )
        register_spec(r.name, spec)
        register_spec(HUB_NAMES[r.name], spec)


_register()

__all__ = [*_LAZY, "PixArtConfig", "PixArtStateDictAdapter"]
