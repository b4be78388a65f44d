"""The main-process side of an image folder's loader: the frozen VAE beside the model encodes what the
cache lacks, writes it to the cache, and completes the cache when the first epoch ends.

Exactness: each image is encoded by `encode_rows` in VAE batches of one fixed shape, so its rows are
the bytes `dit extract` writes whichever images share its batch; they are stored as float16 before
use, and the flips and posterior noise are drawn from (seed, epoch, index) as `LatentShards` draws
them. The data order is the sampler's, untouched. So a step sees exactly the latents it would read
from extract's shards, and the loss matches loss for loss.

Every rank encodes only the images of its own share of each global batch. At the first epoch
boundary every rank writes what it kept, the images no batch asked for (the sampler drops the
epoch's remainder) are split over the ranks and encoded, shard s is packed by rank s mod world, and
rank 0 writes the manifest; from then on the cache is read as `dit extract`'s shards.
"""

import os
import sys
import time
from typing import Optional

import numpy as np
import torch

from dit_trainer.data.encode import ENCODE_BATCH, encode_rows
from dit_trainer.data.captions.files import read_image
from dit_trainer.data.images import IMAGE_ERRORS
from dit_trainer.data.online import cache as lc
from dit_trainer.data.online.dataset import keep_batch
from dit_trainer.errors import DataError


def _dist():
    """(rank, world size) of the process group, (0, 1) without one."""
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


class _NoTF32:
    """Plain fp32 convolutions and matmuls while encoding, as `dit extract` runs them (the trainer turns TF32 on)."""

    def __enter__(self):
        self.saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.saved


class CacheEncoder:
    """StepLoader stage for an `ImageFolderLatents`: `start_epoch(e)` picks the epoch's dataset,
    `__call__(batch)` finishes a half-made batch into (x, y), `flush()` writes what it kept."""

    collate_fn = staticmethod(keep_batch)

    def __init__(self, dataset, device, writes: bool = True, progress: bool = True):
        from dit_trainer.vae.autoencoder import scaling

        self.dataset, self.device, self.writes = dataset, torch.device(device), writes
        self.vae = self.text_model = None
        self.scale = scaling(dataset.vae) if dataset.vae is not None else None
        self.writer = lc.PieceWriter(dataset.root)
        self.complete = None  # the finished cache as LatentShards, once there is one
        self.bar = None
        self.progress = progress
        self.rank, self.world = _dist()
        self.encoded, self.started = 0, None

    # -- the VAE ---------------------------------------------------------------------------

    def _model(self):
        if self.vae is None:
            if self.dataset.vae is None:
                raise DataError(f"the latent cache {self.dataset.root} needs its VAE {self.dataset.plan['vae']} "
                                "to encode; it was not loaded")
            self.vae = self.dataset.vae.to(self.device)  # loaded in data.vae_dtype already
        return self.vae

    def encode(self, images: np.ndarray, index: np.ndarray) -> np.ndarray:
        """float16 rows b×F×K×C×H×W of uint8 images b×H×W×3 (images `index` of the folder)."""
        model, (sf, shift) = self._model(), self.scale
        out = np.empty((len(index), *self.dataset.entry), dtype=lc.STORAGE)
        with _NoTF32():
            for start in range(0, len(index), ENCODE_BATCH):
                part = slice(start, start + ENCODE_BATCH)
                rows, bad = encode_rows(model, images[part], index[part].tolist(), lc.ENTRY_FLIPS, "mean_std", 0, sf,
                                        shift, ENCODE_BATCH)
                if bad:
                    path = self.dataset.paths[int(index[part][bad[0]])]
                    raise DataError(f"{path}: the VAE's latents are NaN or inf; set data.vae_dtype fp32")
                out[part] = rows  # float16 as `dit extract` stores it, before anything reads it
        self._count(len(index))
        return out

    def encode_text(self, index: np.ndarray):
        """The stored text rows (`shard_text`) of the captions of images `index` (None for none: a sharded
        encoder's rank with nothing to encode still takes part in the others' calls)."""
        from dit_trainer.data.encode import encode_text_rows
        from dit_trainer.data.shard_text import to_storage

        ds = self.dataset
        if self.text_model is None:
            if ds.text_model is None:
                raise DataError(f"the latent cache {ds.root} needs its text encoder {ds.text['encoder']} to encode; "
                                "it was not loaded")
            self.text_model = ds.text_model.to(self.device)
        with _NoTF32():
            rows = encode_text_rows(self.text_model, [ds.captions[i] for i in index.tolist()])
        return to_storage(rows, ds.text, ds.where_of(int(index[0]))) if len(index) else None

    def _text_collective(self) -> bool:
        """Whether encoding captions is a collective (a sharded text encoder) that every rank joins."""
        model = self.text_model or self.dataset.text_model
        return self.dataset.text is not None and getattr(model, "group", None) is not None

    def _count(self, n: int) -> None:
        self.encoded += n
        if self.bar is not None:
            # Every data-parallel rank encodes a like share: rank 0's count times the ranks.
            self.bar.update(n * self.world)

    # -- a batch -----------------------------------------------------------------------------

    def __call__(self, batch):
        """(x, y) of a half-made batch: encodes, keeps and finishes the images the cache lacked."""
        ds = self.dataset
        index, todo = batch["index"].numpy(), batch["todo"].numpy()
        if batch["errors"]:
            j, err = batch["errors"][0]
            raise DataError(f"{ds.where_of(int(index[j]))}: {err}; remove or replace it (`dit extract` can skip "
                            "unreadable images instead: train on its shards)")
        if todo.size:
            idx = index[todo]
            rows = self.encode(batch["images"].numpy(), idx)
            text = self.encode_text(idx) if ds.text is not None else None
            if text is not None:
                for field, value in text.items():
                    batch["text"][field][torch.from_numpy(todo)] = torch.from_numpy(value)
            if self.writes:
                self.writer.add(idx, rows, text)
            from dit_trainer.data.shards import epoch_draws

            flips, seeds = epoch_draws(ds.seed, int(batch["epoch"]), idx, ds.random_flip, True)
            batch["x"][torch.from_numpy(todo)] = ds.finish(rows, idx, flips, seeds)
        elif self._text_collective():
            self.encode_text(todo)  # the cache held this rank's share; the other ranks' encoder calls need it
        images = {"image": batch["image"]} if "image" in batch else {}  # REPA's clean images ride along
        if "text" in batch:  # captions are the condition: the text batch keys, no "y"
            return {"x": batch["x"], **{k: v.long() if k == "text_mask" else v for k, v in batch["text"].items()},
                    **images}
        if images:
            return {"x": batch["x"], "y": batch["y"], **images}
        return batch["x"], batch["y"]

    def flush(self) -> None:
        """Write the rows kept so far as a piece of the cache."""
        if self.writes:
            self.writer.flush()

    # -- epochs ------------------------------------------------------------------------------

    def start_epoch(self, epoch: int):
        """(dataset, collate_fn, stage) for `epoch`: the image folder while the cache is incomplete in the
        first epoch, after it the finished cache (completed here, by every rank together)."""
        if self.complete is None and (epoch > 0 or lc.read_manifest_or_none(self.dataset.root)):
            self.complete = self._complete()
        if self.complete is not None:
            self.complete.set_epoch(epoch)
            return self.complete, None, None
        self.dataset.rescan()
        self.dataset.set_epoch(epoch)
        missing = len(self.dataset) - self.dataset.where.covered
        if self.progress and self.rank == 0 and self.bar is None and missing:
            from dit_trainer.progress import progress_bar

            self.bar = progress_bar(total=len(self.dataset), initial=self.dataset.where.covered, unit="img",
                                    desc="latent cache", position=1, leave=False, dynamic_ncols=True, file=sys.stderr)
        self.started = self.started or time.perf_counter()
        return self.dataset, self.collate_fn, self

    def _complete(self):
        """Encode what no batch asked for, pack the shards, write the manifest; every rank calls it."""
        from dit_trainer.data.extract import finish_shards
        from dit_trainer.data.text_shards import open_shards
        from dit_trainer.parallel.utils import any_rank, barrier, from_main

        ds = self.dataset
        root, plan = ds.root, ds.plan
        if lc.read_manifest_or_none(root) is None:
            self.flush()
            barrier()
            where = lc.scan(root, len(ds), ds.entry)
            if any_rank(where.covered != from_main(where.covered), self.device):
                raise DataError(f"the ranks see different contents of the latent cache {root}; set data.cache_dir "
                                "to a folder every node shares")
            missing = np.flatnonzero(where.file_of < 0)
            mine = missing[self.rank * len(missing) // self.world:(self.rank + 1) * len(missing) // self.world]
            self._encode_rest(mine)
            barrier()
            where = lc.scan(root, len(ds), ds.entry)
            lc.pack(root, where, range(self.rank, lc.num_shards(len(ds)), self.world), ds.labels, ds.text)
            barrier()
            if self.rank == 0:
                total = lc.num_shards(len(ds))
                with lc.writing(root, os.path.join(root, lc.sh.MANIFEST)):
                    finish_shards(root, [lc.sh.shard_name(s, total) for s in range(total)], ds.class_names, plan["vae"],
                                  plan["scaling_factor"], plan["shift_factor"], plan["image_size"], True, "mean_std",
                                  lc.STORAGE, list(ds.latent_shape), ds.data_path, text=ds.text)
                lc.remove_pieces(root)
            barrier()
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.rank == 0 and self.encoded:
            seconds = time.perf_counter() - (self.started or time.perf_counter())
            print(f"latent cache {root} is complete: {len(ds)} images; later epochs and runs read it "
                  f"(this rank encoded {self.encoded} in {seconds:.0f} s)", file=sys.stderr)
        self.vae = ds.vae = self.text_model = ds.text_model = None  # their memory goes back to the model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        shards = open_shards(root, random_flip=ds.random_flip, seed=ds.seed, remedy=lc.remedy(root))
        shards.source = ds.source
        shards.read_images_from(ds.paths)
        shards.return_images = ds.return_images
        return shards

    def _encode_rest(self, mine: np.ndarray) -> None:
        """Encode images `mine` (no batch of the first epoch asked for them) and write them as pieces."""
        ds = self.dataset
        chunks = -(-len(mine) // ENCODE_BATCH)
        if self._text_collective():  # every rank runs as many chunks as the busiest, an empty one for the text alone
            from dit_trainer.text_encoders.parallelize import agreed_calls

            chunks = agreed_calls(self.text_model or ds.text_model, chunks)
        for start in range(0, chunks * ENCODE_BATCH, ENCODE_BATCH):
            idx = mine[start:start + ENCODE_BATCH]
            if not len(idx):
                self.encode_text(idx)
                continue
            images = []
            for i in idx.tolist():
                try:
                    images.append(read_image(ds.paths[i], ds.image_size))
                except IMAGE_ERRORS as err:
                    raise DataError(f"{ds.where_of(i)}: {type(err).__name__}: {err}; remove or replace it".replace("\n", " ")) from None
            self.writer.add(idx, self.encode(np.stack(images), idx), self.encode_text(idx) if ds.text is not None else None)
        self.writer.flush()


def encoder_for(dataset, device, dims=None, progress: bool = True) -> Optional[CacheEncoder]:
    """The stage an image folder's loader needs on `device` (None for other datasets); TP and PP peers
    of a data-parallel rank encode its share alike, and only the first of them writes it. Under FSDP a
    frozen text encoder is sharded over the `dp_shard` mesh as the model is (`text_encoders.parallelize`)."""
    if not hasattr(dataset, "where") or not hasattr(dataset, "plan"):
        return None
    text_model = getattr(dataset, "text_model", None)
    if dims is not None and dims.fsdp_enabled and text_model is not None and text_model.group is None:
        from dit_trainer.text_encoders.parallelize import shard_text_encoder

        shard_text_encoder(text_model.to(device), dims.mesh["dp_shard"])
    writes = dims is None or (dims.tp_rank == 0 and dims.pp_rank == 0)
    return CacheEncoder(dataset, device, writes=writes, progress=progress)
