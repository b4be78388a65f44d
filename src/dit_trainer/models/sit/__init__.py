"""The SiT family (Ma et al., 2024): DiT's backbone trained as interpolant transport,
registered under the release's names ("SiT-XL/2", ...). Its options, parallel plan and
state-dict adapter are DiT's: the parameter names are the same."""

from dit_trainer.models.dit import register_family
from dit_trainer.models.sit.model import SiT, SiT_models

register_family(SiT_models, "sit", objective="transport")

__all__ = ["SiT", "SiT_models"]
