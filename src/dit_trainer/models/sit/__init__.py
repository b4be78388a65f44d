"""The SiT family (Ma et al., 2024): DiT's backbone trained as interpolant transport,
registered under the release's names ("SiT-XL/2", ...). Its options, parallel plan and
state-dict adapter are DiT's: the parameter names are the same."""

from dit_trainer.lazy import lazy_exports
from dit_trainer.models.dit import register_family

_LAZY = {"SiT": "dit_trainer.models.sit.model", "SiT_models": "dit_trainer.models.sit.model"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

register_family("SiT", "dit_trainer.models.sit.model:SiT_models", "sit", objective="transport")

__all__ = list(_LAZY)
