"""The RFC's data path: a `mindspore.dataset.GeneratorDataset` over our latent formats, read with
numpy alone: a folder of per-image `.npy` latents (labels file beside them, as `dit extract`
writes) and packed shard folders (`manifest.json`, `shard-XXXXX.npy` N×F×K×C×H×W, `.labels.npy`).

Batches follow a seeded permutation per epoch, so the batch of step s is a function of (seed, s)
and a resumed run reads exactly what it would have read. Shard flips use the same SplitMix64 bit
as `dit_trainer.data.shards`; the posterior noise of `mean_std` shards comes from numpy here (the
PyTorch path draws it with torch's generator), so sampled latents differ between the backends.
"""

import glob
import json
import os

import numpy as np

from dit_trainer.errors import DataError
from dit_trainer.data import labels as labels_mod

_MASK64 = (1 << 64) - 1
SHARD_FORMAT = "dit-trainer-latent-shards"


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _as_chw(path, array):
    if array.ndim == 4 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 3:
        raise DataError(f"{path} has shape {array.shape}; save one latent per file as C×H×W or 1×C×H×W")
    return array


class NpyLatents:
    """Random-access source over a folder of `.npy` latents: item i -> (x float32 C×H×W, y int32)."""

    def __init__(self, path, labels_file=None, random_flip=False, seed=0):
        labels_file = labels_file or labels_mod.find_labels_file(path)
        skip = {"labels.npy", os.path.basename(labels_file) if labels_file else None}
        self.paths = sorted(p for p in glob.glob(os.path.join(path, "*.npy")) if os.path.basename(p) not in skip)
        if not self.paths:
            raise DataError(f"{path} holds no .npy latents; run `dit extract` into it")
        stems = [os.path.splitext(os.path.basename(p))[0] for p in self.paths]
        if labels_file:
            self.labels = np.asarray(labels_mod.read_labels_file(labels_file, stems)[0], dtype=np.int64)
        else:
            self.labels = np.zeros(len(self.paths), dtype=np.int64)
        self.random_flip, self.seed, self.epoch = random_flip, seed, 0

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        x = _as_chw(self.paths[i], np.load(self.paths[i], allow_pickle=False)).astype(np.float32)
        if self.random_flip and np.random.default_rng([self.seed, self.epoch, int(i)]).random() < 0.5:
            x = x[..., ::-1].copy()
        return x, np.int32(self.labels[i])


class ShardLatents:
    """Random-access source over a shard folder written by `dit extract` / `dit data convert`."""

    def __init__(self, path, random_flip=True, seed=0):
        file = os.path.join(path, "manifest.json")
        try:
            with open(file, encoding="utf-8") as f:
                m = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise DataError(f"cannot read {file} ({err}); run `dit data verify`") from None
        if m.get("format") != SHARD_FORMAT:
            raise DataError(f"{file} is not a {SHARD_FORMAT} manifest; point at a folder written by `dit extract`")
        self.root, self.m = path, m
        self.names = [s["name"] for s in m["shards"]]
        self.offsets = np.concatenate([[0], np.cumsum([int(s["count"]) for s in m["shards"]])]).astype(np.int64)
        self.labels = np.concatenate([np.load(os.path.join(path, f"{n}.labels.npy")) for n in self.names])
        self.stored_flips = bool(m["flips"])
        self.sample_posterior = m["posterior"] == "mean_std"
        self.random_flip, self.seed, self.epoch = random_flip, seed, 0
        self._arrays = {}

    def __len__(self):
        return int(self.offsets[-1])

    def _array(self, shard):
        if shard not in self._arrays:
            self._arrays[shard] = np.load(os.path.join(self.root, f"{self.names[shard]}.npy"), mmap_mode="r")
        return self._arrays[shard]

    def __getitem__(self, i):
        i = int(i)
        shard = int(np.searchsorted(self.offsets, i, side="right")) - 1
        state = _splitmix64(_splitmix64(_splitmix64(self.seed) ^ self.epoch) ^ i)
        flip = state >> 63 == 1 and self.random_flip
        row = np.asarray(self._array(shard)[i - self.offsets[shard], int(flip and self.stored_flips)], dtype=np.float32)
        x = row[0]
        if self.sample_posterior:
            x = x + row[1] * np.random.default_rng(_splitmix64(state) >> 1).standard_normal(x.shape, dtype=np.float32)
        if flip and not self.stored_flips:
            x = x[..., ::-1]
        return np.ascontiguousarray(x), np.int32(self.labels[i])


def open_source(path, labels_file=None, random_flip=False, seed=0):
    """The latent source at `path`: shards if it holds manifest.json, else a `.npy` folder."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise DataError(f"{path} is not a folder; pass the folder holding the latents")
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return ShardLatents(path, random_flip=random_flip, seed=seed)
    return NpyLatents(path, labels_file=labels_file, random_flip=random_flip, seed=seed)


def epoch_order(n, seed, epoch):
    """The permutation of item indices an epoch reads."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def build_dataset(source, batch_size, seed=0, epoch=0, skip_batches=0):
    """GeneratorDataset of (x, y) batches for one epoch of `source`, starting after `skip_batches`."""
    import mindspore.dataset as ds

    if len(source) < batch_size:
        raise DataError(f"the dataset holds {len(source)} latents, fewer than the batch size {batch_size}")
    source.epoch = epoch
    order = epoch_order(len(source), seed, epoch)[skip_batches * batch_size:]
    order = order[: len(order) // batch_size * batch_size]
    dataset = ds.GeneratorDataset(source, column_names=["x", "y"], sampler=ds.SubsetSampler(order.tolist()),
                                  num_parallel_workers=1, python_multiprocessing=False)
    return dataset.batch(batch_size, drop_remainder=True)
