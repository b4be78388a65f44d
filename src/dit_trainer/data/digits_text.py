"""scikit-learn's digits with captions of what each shows, encoded by a frozen text encoder: the training
set of the text-conditioned demo (`data.path: digits` with `data.text_encoder`).

Each digit's caption comes from its pixels (`digit_attributes`: "a thin upright three", or "a thin
three" where its slant is a near call); the digits whose (digit, weight, slant) triple is held out
(`HELD_OUT`) are left out, so the model never sees those combinations. Each epoch also leaves each
attribute word out of a caption with probability `WORD_DROPOUT` (drawn from the seed and the epoch,
like a flip), so "a three" and "a thin three" are learned as well as the full caption: the model
learns what each word does apart from the others, which is what a held-out combination asks of it,
and the digit alone is a prompt to guide away from. The captions are few (at most 4 per triple), so
each is encoded once when the dataset is built and items share their caption's rows. Items are the
batch dicts of any text dataset.
"""

import numpy as np
import torch
from torch.utils.data import Dataset

from dit_trainer.data.digit_attributes import caption, clear_of_cuts, digit_captions
from dit_trainer.data.digits import load_digit_arrays, upsample_digits
from dit_trainer.data.indexing import check_epoch, check_index
from dit_trainer.errors import ConfigError

WORD_DROPOUT = 0.2  # per epoch and item, the chance each attribute word is left out of the caption


def _on_cpu(encoded: dict) -> dict:
    """An encoder's outputs on the CPU, float32 (a bf16 encoder's too) but for the integer mask."""
    return {k: (v.float() if v.is_floating_point() else v).cpu() for k, v in encoded.items()}


class CaptionedDigits(Dataset):
    """1×S×S digits in [-1, 1] with their captions' `text_embeds` and `text_mask` (`encoder`: a `TextEncoder`)."""

    pixel_space = True
    num_classes = class_names = None  # the caption is the condition
    text_pooled_size = None

    def __init__(self, encoder, image_size: int = 8, seed: int = 0, held_out: bool = True):
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8 or image_size % 8:
            raise ConfigError(f"digits image_size must be a multiple of 8 (8, 16 or 32), got {image_size!r}")
        if encoder.pooled_size is not None:
            raise ConfigError(f"the captioned digits take a T5 or Gemma 2 text encoder; {encoder.name} is a "
                              f"{encoder.kind} with a pooled output")
        known = digit_captions()
        keep = np.flatnonzero(~known.held_out) if held_out else np.arange(len(known.digits))
        self.images = upsample_digits(load_digit_arrays()[0][keep], image_size)
        self.indices = keep  # into load_digit_arrays()
        self.digits, self.weights, self.slants = known.digits[keep], known.weights[keep], known.slants[keep]
        # Which attributes a caption may say at all: a near call never (digit_attributes.MARGIN).
        self.says_weight, self.says_slant = known.says_weight[keep], known.says_slant[keep]
        self.image_size, self.latent_shape = image_size, (1, image_size, image_size)
        self.text_encoder = encoder.name
        self.text_max_length, self.text_hidden_size = encoder.max_length, encoder.hidden_size
        self.source = f"the captioned digits (text encoder {encoder.name})"
        self.seed, self.epoch = int(seed), 0
        distinct = sorted({caption(d, w, s) for d, w, s in zip(self.digits.tolist(), self.weights.tolist(),
                                                                self.slants.tolist())
                           for w, s in ((w, s), (None, s), (w, None), (None, None))})
        self._row = {c: i for i, c in enumerate(distinct)}
        self.text = _on_cpu(encoder.encode(distinct))
        self._null = {k: v[0] for k, v in _on_cpu(encoder.encode([""])).items()}
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose attribute words are left out."""
        self.epoch = check_epoch(epoch)
        kept = np.random.default_rng([self.seed, self.epoch, 53]).random((len(self.digits), 2)) >= WORD_DROPOUT
        self.captions = [caption(d, w if kw else None, s if ks else None) for d, w, s, kw, ks in
                         zip(self.digits.tolist(), self.weights.tolist(), self.slants.tolist(),
                             (kept[:, 0] & self.says_weight).tolist(), (kept[:, 1] & self.says_slant).tolist())]
        self.caption_index = torch.tensor([self._row[c] for c in self.captions])

    def null_text(self) -> dict:
        """The encoding of "" (caption dropout and guidance)."""
        return dict(self._null)

    def __len__(self) -> int:
        return len(self.digits)

    def __getitem__(self, index: int) -> dict:
        index = check_index(index, len(self))
        row = int(self.caption_index[index])
        return {"x": self.images[index], **{k: v[row] for k, v in self.text.items()}}
