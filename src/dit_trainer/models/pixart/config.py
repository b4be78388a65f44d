"""The PixArt family's own model options; None keeps the named release's value."""

from dataclasses import dataclass
from typing import Optional

from dit_trainer.errors import ConfigError


@dataclass
class PixArtConfig:
    """Size and conditioning overrides of a named PixArt (small members for tests keep the family)."""

    depth: Optional[int] = None  # transformer blocks (default: the release's 28)
    hidden_size: Optional[int] = None  # token width (default: 1152); a multiple of 4, and of 3 with micro-conditions
    num_heads: Optional[int] = None  # attention heads, must divide hidden_size (default: 16)
    mlp_ratio: Optional[float] = None  # MLP width / hidden_size (default: 4)
    text_hidden_size: Optional[int] = None  # width of the text encoder's token embeddings, PixArt's caption_channels (default: 4096, T5-XXL); text data sets it
    interpolation_scale: Optional[float] = None  # sin-cos positions are arange(grid) / this (default: the release's; 1024 px: 2)
    micro_conditions: Optional[bool] = None  # the image's resolution and aspect ratio condition the model (default: PixArt-alpha 1024's only)

    def resolved(self, name: str) -> dict:
        """Every option, the release `name`'s value where this one is None."""
        from dit_trainer.models.pixart.sizes import CAPTION_CHANNELS, SIZES, release

        r = release(name)
        depth, hidden, heads = SIZES["XL"]
        given = {"depth": self.depth, "hidden_size": self.hidden_size, "num_heads": self.num_heads,
                 "mlp_ratio": self.mlp_ratio, "text_hidden_size": self.text_hidden_size,
                 "interpolation_scale": self.interpolation_scale, "micro_conditions": self.micro_conditions}
        default = {"depth": depth, "hidden_size": hidden, "num_heads": heads, "mlp_ratio": 4.0,
                   "text_hidden_size": CAPTION_CHANNELS, "interpolation_scale": r.interpolation_scale,
                   "micro_conditions": r.micro_conditions}
        return {k: default[k] if v is None else v for k, v in given.items()}

    def check(self, name: str, model) -> None:
        """One-line ConfigError for options the model `name` cannot be built with (input size from `model`)."""
        for key in ("depth", "hidden_size", "num_heads", "mlp_ratio", "text_hidden_size", "interpolation_scale"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ConfigError(f"model.{key} is {value!r}; it must be a positive number")
        o = self.resolved(name)
        hidden, heads = o["hidden_size"], o["num_heads"]
        if hidden % heads:
            raise ConfigError(f"model.num_heads {heads} does not divide model.hidden_size {hidden} of {name}; "
                              "change either")
        if hidden % 4:
            raise ConfigError(f"model.hidden_size {hidden} of {name} is not a multiple of 4, which the 2-D sin-cos "
                              "position embedding needs; change it")
        if o["micro_conditions"] and hidden % 3:
            raise ConfigError(f"model.hidden_size {hidden} of {name} is not a multiple of 3, which the micro-conditions "
                              "need (resolution takes 2/3 of the width, aspect ratio 1/3); change it or set "
                              "model.micro_conditions false")
        size = getattr(model, "input_size", None)
        if size is not None and size % 2:
            raise ConfigError(f"model.input_size {size} is not divisible by {name}'s patch size 2; use an even "
                              "latent size (image size / 8)")
