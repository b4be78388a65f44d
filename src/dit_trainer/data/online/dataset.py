"""An image folder read through its latent cache: the worker side of `dit train --data.path IMAGES`.

A batch comes out of the DataLoader workers half made: images whose rows the cache holds are
finished latents already (the flips and posterior noise `LatentShards` would draw), the others are
decoded, center-cropped images for the main process to encode (`encoder.CacheEncoder`), which
finishes them the same way. So every latent is what `dit extract` + `LatentShards` give.
"""

import os
from typing import Dict, List, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from dit_trainer.data.captions.files import read_image, ref_name
from dit_trainer.data.images import IMAGE_ERRORS
from dit_trainer.data.indexing import check_epoch
from dit_trainer.data.online import cache as lc
from dit_trainer.data.shards import epoch_draws, latents_from_rows


def keep_batch(items):
    """The DataLoader's collate_fn for half-made batches: `__getitems__` already made the batch."""
    return items


class ImageFolderLatents(Dataset):
    """Map-style dataset over an image folder whose latents are cached as they are first encoded."""

    def __init__(self, data_path: str, folder: str, plan: Dict, paths: List[str], labels: np.ndarray,
                 class_names: List[str], random_flip: bool = True, seed: int = 0, vae=None):
        self.data_path, self.root, self.plan = data_path, folder, plan
        self.paths, self.labels, self.class_names = list(paths), np.asarray(labels, dtype=np.int64), class_names
        self.num_classes = len(class_names) if class_names is not None else None
        self.latent_shape = tuple(int(s) for s in plan["latent_shape"])
        self.image_size = int(plan["image_size"])
        self.entry = (lc.ENTRY_FLIPS, lc.ENTRY_KINDS, *self.latent_shape)
        self.random_flip, self.seed, self.epoch = bool(random_flip), int(seed), 0
        # What the finished cache's manifest will say; the config takes the VAE and sizes from it.
        self.manifest = {"vae": plan["vae"], "image_size": self.image_size, "scaling_factor": plan["scaling_factor"],
                         "shift_factor": plan["shift_factor"]}
        self.source = f"the image folder {data_path}"
        self.vae = vae  # the frozen VAE, on the CPU until the trainer's encoder takes it
        self.where = lc.scan(folder, len(self.paths), self.entry)
        self._opened: Dict[int, np.ndarray] = {}
        self._pid = os.getpid()
        self._generator = None
        # REPA (`return_images`): every item also carries its crop, re-read from the folder.
        self.stored_images, self.return_images = True, False
        self.text = self.text_model = None  # captioned images: see `attach_text`

    def attach_text(self, encoder, captions: List[str], text: Dict) -> None:
        """Captioned images: each item's caption is encoded by `encoder` (on the CPU until the trainer's
        encoder takes it) beside its latents, stored as the manifest `text` record says (`shard_text`)."""
        self.text, self.text_model, self.captions = text, encoder, list(captions)
        self.text_encoder = text["encoder"]  # its name, as TextShards give it
        self.num_classes = self.class_names = None  # the caption is the condition
        self.text_max_length, self.text_hidden_size = text["max_length"], text["hidden_size"]
        self.text_pooled_size = text["pooled_size"]

    def where_of(self, index: int) -> str:
        """Image `index` as a user finds it: a path, a URL or `shard:member`."""
        return ref_name(self.paths[index])

    def null_text(self) -> Dict[str, torch.Tensor]:
        """The encoding of "" (stored in the cache when it was opened)."""
        from dit_trainer.data.shard_text import read_null

        return read_null(self.root, self.text, lc.remedy(self.root))

    def __getstate__(self):
        # Workers need neither the VAE, the text encoder nor the parent's mmaps.
        state = dict(self.__dict__)
        state["vae"], state["text_model"], state["_opened"], state["_generator"] = None, None, {}, None
        return state

    def __len__(self) -> int:
        return len(self.paths)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose flips and posterior noise the latents take."""
        self.epoch = check_epoch(epoch)

    def rescan(self) -> None:
        """Look again at what the cache holds (before an epoch's workers start)."""
        self.where = lc.scan(self.root, len(self.paths), self.entry)
        self._opened = {}

    def finish(self, rows: np.ndarray, index: np.ndarray, flips: np.ndarray, noise_seeds) -> torch.Tensor:
        """Latents from full rows b×F×K×C×H×W: the stored flip the draw picked, mean + std·noise."""
        if self._generator is None or self._pid != os.getpid():
            self._generator, self._pid = torch.Generator(), os.getpid()
        picked = rows[np.arange(len(index)), flips.astype(np.int64)]
        return latents_from_rows(picked, (flips, noise_seeds), True, self._generator)

    def __getitems__(self, indices: Sequence[int]) -> Dict:
        """A half-made batch: `x` finished where the cache had the rows, `todo` (positions), `images` and
        `errors` ((position, message) of unreadable files) for the main process to encode."""
        if self._pid != os.getpid():
            self._opened, self._generator, self._pid = {}, None, os.getpid()
        index = np.asarray([int(i) for i in indices], dtype=np.int64)
        flips, seeds = epoch_draws(self.seed, self.epoch, index, self.random_flip, True)
        x = torch.empty((len(index), *self.latent_shape))
        cached = self.where.file_of[index] >= 0
        have = np.flatnonzero(cached)
        if have.size:
            variant = flips[have].astype(np.int64)
            # Only the flip the draw picked is read: half the bytes of a full row.
            rows = lc.gather(self.where, index[have], self._opened, lambda part, at: part[np.arange(len(at)), variant[at]])
            if self._generator is None:
                self._generator = torch.Generator()
            x[torch.from_numpy(have)] = latents_from_rows(rows, (flips[have], [seeds[j] for j in have]), True,
                                                          self._generator)
        todo = np.flatnonzero(~cached)
        images, errors = [], []
        for j in todo.tolist():
            try:
                images.append(read_image(self.paths[index[j]], self.image_size))
            except IMAGE_ERRORS as err:
                errors.append((j, f"{type(err).__name__}: {err}".replace("\n", " ")))
        side = self.image_size
        extra = {}
        if self.return_images:
            from dit_trainer.data.shard_images import folder_images

            extra["image"] = folder_images(self.paths, index, side, flips)
        if self.text is not None:
            extra["text"] = self._text_rows(index, have)
        return {**extra, "epoch": self.epoch, "index": torch.from_numpy(index), "x": x,
                "y": torch.from_numpy(self.labels[index]), "todo": torch.from_numpy(todo),
                "images": torch.from_numpy(np.stack(images)) if images else torch.empty((0, side, side, 3), dtype=torch.uint8),
                "errors": errors}

    def _text_rows(self, index: np.ndarray, have: np.ndarray) -> Dict[str, torch.Tensor]:
        """The stored text rows of items `index`, those at positions `have` read from the cache (the rest
        are zeros for the main process to fill)."""
        from dit_trainer.data.shard_text import fields_of, row_shape, storage_of

        out = {}
        for field in fields_of(self.text):
            rows = np.zeros((len(index), *row_shape(self.text, field)), dtype=storage_of(self.text, field))
            if have.size:
                rows[have] = lc.gather(self.where, index[have], self._opened, field=field)
            out[field] = torch.from_numpy(rows)
        return out
