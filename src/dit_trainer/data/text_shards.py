"""`TextShards`: the shards of a text-to-image extract, read as the trainer's text batches.

Items are dicts {"x": C×H×W latents (drawn as `LatentShards` draws them), "text_embeds": L×D,
"text_mask": L int64, and "text_pooled": P for an encoder with a pooled output}: the default collate
stacks them into the batch dict the condition reads (no "y": captions are the condition).
`null_text()` is the stored encoding of "".
"""

import os

import numpy as np

from dit_trainer.data import shard_text
from dit_trainer.data.shards import MANIFEST, LatentShards, read_manifest
from dit_trainer.errors import DataError


class TextShards(LatentShards):
    """LatentShards whose items carry their caption's text-encoder outputs instead of a label."""

    def __init__(self, path, random_flip: bool = True, sample_posterior: bool = True, seed: int = 0, remedy=None):
        super().__init__(path, random_flip=random_flip, sample_posterior=sample_posterior, seed=seed, remedy=remedy)
        file = os.path.join(self.root, MANIFEST)
        problems = shard_text.text_problems(file, self.manifest.get("text"))
        if problems:
            raise DataError(problems[0])
        self.text = self.manifest["text"]
        for entry in self.manifest["shards"]:
            missing = [f for f in shard_text.fields_of(self.text) if f"{f}_sha256" not in entry and entry["count"]]
            if missing:
                raise DataError(f"{file}: shard {entry['name']} records no {missing[0]} file; {self.remedy}")
        # No class labels: a class-count is not the model's to take from these shards.
        self.num_classes = self.class_names = None
        self.text_encoder = self.text["encoder"]
        self.text_max_length, self.text_hidden_size = self.text["max_length"], self.text["hidden_size"]
        self.text_pooled_size = self.text["pooled_size"]
        self._text_arrays, self._text_pid = {}, os.getpid()

    def __getstate__(self):
        state = super().__getstate__()
        state["_text_arrays"], state["_text_pid"] = {}, None  # workers map their own files
        return state

    def __getitems__(self, indices):
        """Items for a batch of indices: the latents' draws, then each caption's rows."""
        items = super().__getitems__(indices)
        index = self.check_indices(indices)
        text = shard_text.batch_text(self, index, np.searchsorted(self.offsets, index, side="right") - 1)
        out = []
        for j, item in enumerate(items):
            fields = {k: v for k, v in item.items() if k != "y"} if isinstance(item, dict) else {"x": item[0]}
            out.append({**fields, **{k: v[j] for k, v in text.items()}})
        return out

    def null_text(self):
        """The encoding of "": {"text_embeds" (L, D), "text_mask" (L,) int64[, "text_pooled" (P,)]}."""
        return shard_text.read_null(self.root, self.text, self.remedy)


def open_shards(path, random_flip: bool = True, seed: int = 0, remedy=None) -> LatentShards:
    """The shard folder at `path`: `TextShards` when its manifest records a text encoder, else `LatentShards`."""
    cls = TextShards if read_manifest(os.fspath(path)).get("text") is not None else LatentShards
    return cls(path, random_flip=random_flip, seed=seed, remedy=remedy)
