"""Captions (PixArt; SD3 and Flux next): a frozen text encoder's outputs, dropped to the encoding of "".

The model takes the caption's token embeddings and mask (and a pooled vector where the family
needs one) under the batch's own names, `model(x_t, t, text_embeds=..., text_mask=...)`, beside
any image micro-conditions it declares (PixArt-alpha 1024's `resolution` and `aspect_ratio`).
Caption dropout replaces a dropped row's caption tensors by the null caption's, the encoding of ""
(diffusers' convention, so an exported model guides as diffusers' pipelines do); the model holds no
learned null caption. The null comes from the training data (`dataset.null_text()`, stored by
`dit extract` beside the shards) or, when sampling, from the text encoder (`null_from_encoder`).
"""

import torch

from dit_trainer.condition import DROPOUT_KEYS
from dit_trainer.condition.base import Condition
from dit_trainer.errors import ConfigError, DataError

# The caption's tensors: what dropout and the null caption replace. Other keys (micro-conditions)
# describe the image and stay as they are.
CAPTION_KEYS = ("text_embeds", "text_mask", "text_pooled")
# Captions held out for validation by default (fewer for data under 6,400 images: at most 1%).
VAL_SPLIT = 64
# Integer tensors keep their dtype (the mask); the rest are float32 inputs that autocast casts.
_INTEGER = ("text_mask",)


def square_micro_conditions(keys, n: int, size, device="cpu") -> dict:
    """The micro-conditions among `keys` of `n` square images of `size` pixels: `resolution` (n, 2) [size, size],
    `aspect_ratio` (n, 1) 1; as PixArt-alpha's fixed-resolution data and diffusers' pipeline give them."""
    values = {"resolution": [float(size), float(size)], "aspect_ratio": [1.0]}
    return {k: torch.tensor([values[k]] * n, device=device) for k in keys if k in values}


def _row_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B,) mask shaped to broadcast over `like`'s trailing dims."""
    return mask.to(like.device, torch.bool).view(-1, *([1] * (like.dim() - 1)))


class TextCondition(Condition):
    """A caption per sample as a text encoder's outputs; dropped rows take the null caption's."""

    name = "text"
    dropout_key = DROPOUT_KEYS["text"]
    grid_from_rows = True  # prompts (logging.validation_prompts) or held-out captions

    def __init__(self, keys, dropout_prob: float = 0.1, model_name: str = "the model", width=None, image_size=None):
        super().__init__(dropout_prob)
        self.width = width  # the token embeddings' width the model takes (the model's caption_channels), if known
        # The training images' size in pixels: the micro-conditions of a batch that does not carry its own.
        self.image_size = image_size
        self.keys = tuple(keys)
        self.caption_keys = tuple(k for k in self.keys if k in CAPTION_KEYS)
        if "text_embeds" not in self.caption_keys:
            raise ValueError(f"a text condition needs text_embeds among its keys, got {self.keys}")
        self.model_name = model_name
        self.null = None  # caption key -> the encoding of "" without the batch dim, on the run's device

    @classmethod
    def from_config(cls, cfg, model=None):
        """The keys `model.condition_keys` declares, captions dropped with `data.caption_dropout_prob`."""
        keys = getattr(model, "condition_keys", ("text_embeds", "text_mask"))
        return cls(keys, cfg.data.caption_dropout_prob, cfg.model.name, getattr(model, "caption_channels", None),
                   getattr(cfg.data, "image_size", None))

    def check_config(self, cfg) -> None:
        # FID during training samples held-out captions with classifier-free guidance alone.
        for key in ("guide", "guidance_interval"):
            if getattr(cfg.eval, key) is not None:
                raise ConfigError(f"eval.{key} {getattr(cfg.eval, key)}: FID during training samples a text-conditioned "
                                  f"model's held-out captions with classifier-free guidance alone; leave eval.{key} unset")

    def default_val_split(self, n: int) -> int:
        """64 captions (at most 1% of the data), as text-to-image runs validate on held-out captions."""
        return min(VAL_SPLIT, n // 100)

    def _cast(self, key: str, value, device) -> torch.Tensor:
        value = torch.as_tensor(value)
        dtype = torch.long if key in _INTEGER else torch.float32
        return value.to(device, dtype=dtype, non_blocking=True)

    def set_null(self, null: dict, device, source: str = "the null caption") -> None:
        """Use `null` (caption key -> tensor without the batch dim, the encoding of "") for dropout and guidance."""
        missing = [k for k in self.caption_keys if k not in null]
        if missing:
            raise DataError(f"{source} has no {', '.join(missing)}, which {self.model_name} takes; re-extract the "
                            "captions with the text encoder the model is trained on")
        width = int(torch.as_tensor(null["text_embeds"]).shape[-1])
        if self.width is not None and width != self.width:
            raise DataError(f"{source} is {width} wide (its text encoder's hidden size) but {self.model_name} takes "
                            f"{self.width}-wide token embeddings; set model.text_hidden_size {width}")
        self.null = {k: self._cast(k, null[k], device) for k in self.caption_keys}

    def bind(self, dataset, device) -> None:
        """The training data's null caption (`dataset.null_text()`); a dataset without captions is one line."""
        null_text = getattr(dataset, "null_text", None)
        if null_text is None:
            raise DataError(f"{self.model_name} is text-conditioned but the {type(dataset).__name__} it is given "
                            "holds no captions (it has no null_text()); train it on captioned data (data.text_encoder)")
        self.set_null(null_text(), device, f"the null caption of the {type(dataset).__name__}")

    def null_from_encoder(self, encoder, device) -> None:
        """The null caption encoded by `encoder` (a `TextEncoder`), for sampling without the training data."""
        self.set_null({k: v[0] for k, v in encoder.encode([""]).items()}, device, f"the text encoder {encoder.name}")

    def inputs(self, batch, device) -> dict:
        """The caption tensors (and micro-conditions) of a `{"x", "text_embeds", "text_mask", ...}` batch. Micro-
        conditions the batch does not carry are the training images' (square, `image_size` pixels)."""
        if isinstance(batch, dict) and self.image_size and "text_embeds" in batch:
            absent = [k for k in self.keys if k not in self.caption_keys and k not in batch]
            if absent:
                n = len(batch["text_embeds"])
                batch = {**batch, **square_micro_conditions(absent, n, self.image_size)}
        if not isinstance(batch, dict) or any(k not in batch for k in self.keys):
            have = sorted(batch) if isinstance(batch, dict) else f"a {type(batch).__name__} of {len(batch)}"
            missing = [k for k in self.keys if not isinstance(batch, dict) or k not in batch]
            raise DataError(f"{self.model_name} takes {', '.join(self.keys)} from each batch but the batch lacks "
                            f"{', '.join(missing)} (it holds {have}); train it on captioned data (data.text_encoder)")
        return {k: self._cast(k, batch[k], device) for k in self.keys}

    def from_prompts(self, encoder, prompts, device, **micro) -> dict:
        """The keyword arguments of `prompts` encoded by `encoder` (sampling's conditional half, or a
        negative prompt's rows), with the image's micro-conditions `micro` where the model takes them."""
        return self.inputs({**encoder.encode(list(prompts)), **micro}, device)

    def _null(self) -> dict:
        if self.null is None:
            raise DataError(f"{self.model_name}'s caption dropout and guidance need the null caption's encoding; "
                            "give the trainer a captioned dataset (with null_text()) or encode one (null_from_encoder)")
        return self.null

    def drop(self, kwargs: dict, mask: torch.Tensor) -> dict:
        """Rows where `mask` holds get the null caption's tensors (the encoding of "")."""
        null, out = self._null(), dict(kwargs)
        for key in self.caption_keys:
            value = kwargs[key]
            if tuple(null[key].shape) != tuple(value.shape[1:]):
                raise DataError(f"the null caption's {key} is {tuple(null[key].shape)} but the batch's rows are "
                                f"{tuple(value.shape[1:])}; encode \"\" with the captions' encoder and max length")
            out[key] = torch.where(_row_mask(mask, value), null[key].to(value.dtype), value)
        return out

    def unconditional(self, n: int, device) -> dict:
        """`n` rows of the null caption; the image's micro-conditions come from the conditional rows
        (`guidance_kwargs` repeats them)."""
        return {k: v.to(device).expand(n, *v.shape).clone() for k, v in self._null().items()}
