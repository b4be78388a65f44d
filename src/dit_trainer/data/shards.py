"""Packed latent shards: many latents per file, a manifest, and the `LatentShards` dataset.

Format: each shard is one raw `.npy` array of shape N×F×K×C×H×W (F = 2 when both horizontal flips
were encoded, K = 2 for posterior mean and std, 1 for a stored sample) plus a small
`.labels.npy`; `manifest.json` describes the whole set. We chose `.npy` memmaps over safetensors:

- random access is one offset computation into a read-only memmap (`npy.open_memmap`), with no header
  parse or Python-level slice object per item (safetensors' `get_slice` costs both), and only the
  bytes of that latent are paged in;
- each worker opens one mmap per shard, lazily, and keeps it, so there is no per-sample open();
  a single array per shard (not one file per field) keeps that to ~630 mmaps at ImageNet 256;
- the writer can emit a shard with plain `np.save` and numpy, torch and any language with a
  `.npy` reader can consume it without this package.

A shard is finished when its `.json` marker exists; arrays are written to temporary names and
renamed first, so an interrupted run leaves no finished-looking partial shard.

Randomness is a pure function of (seed, epoch, index), so DataLoader workers, resumed runs and
distributed ranks agree: a counter-based SplitMix64 hash of the three gives the flip bit and the
seed of a torch generator that draws the posterior noise. It replaces `np.random.default_rng([seed,
epoch, i])`, whose SeedSequence costs a third of an item's time; torch's normal sampler is twice
as fast as numpy's. Items are produced a batch at a time (`__getitems__`), which amortises numpy
and torch call overhead; both together are what reach 20k+ latents/s on two cores.
"""

import io
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from dit_trainer.data import checksums
from dit_trainer.data.atomic import atomic_json as _atomic_json, atomic_npy as _atomic_npy
from dit_trainer.data.indexing import NPY_ERRORS, check_epoch
from dit_trainer.errors import ConfigError, DataError, one_line
from dit_trainer.fs import check_regular
from dit_trainer.npy import open_memmap, read_array

FORMAT = "dit-trainer-latent-shards"
VERSION = 1
MANIFEST = "manifest.json"
POSTERIOR_KINDS = ("mean_std", "sample")
STORAGE_DTYPES = ("float16", "float32")
_MASK64 = (1 << 64) - 1
REQUIRED_KEYS = ("format", "version", "count", "latent_shape", "dtype", "num_classes", "class_names",
                 "vae", "scaling_factor", "image_size", "flips", "posterior", "shards")


def shard_name(index: int, total: int) -> str:
    """File stem of shard `index` of `total`, zero-padded so names sort in index order."""
    return f"shard-{index:0{max(5, len(str(max(total - 1, 0))))}d}"


def shard_done(root: str, name: str) -> bool:
    """Whether shard `name` was fully written (its marker exists)."""
    return os.path.isfile(os.path.join(root, f"{name}.json"))


def read_shard_marker(root: str, name: str) -> Dict:
    """The `.json` marker of a finished shard: count and skipped files."""
    path = os.path.join(root, f"{name}.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read {path} ({err}); delete it to re-encode that shard") from None


class ShardWriter:
    """Buffers one shard in memory, then writes array, labels and marker atomically."""

    def __init__(self, root: str, name: str, capacity: int, entry_shape: Sequence[int], dtype: str = "float16"):
        if dtype not in STORAGE_DTYPES:
            raise ConfigError(f"shard dtype {dtype!r} is not supported; use one of {', '.join(STORAGE_DTYPES)}")
        self.root, self.name = root, name
        self.data = np.empty((capacity, *entry_shape), dtype=dtype)
        self.labels = np.empty(capacity, dtype=np.int64)
        self.count = 0

    def add(self, latents: np.ndarray, labels: np.ndarray) -> None:
        """Append a batch: latents b×F×K×C×H×W (any float dtype), labels b."""
        n = len(latents)
        if self.count + n > len(self.data):
            raise ValueError(f"shard {self.name} holds {len(self.data)} entries; got {self.count + n}")
        self.data[self.count:self.count + n] = latents
        self.labels[self.count:self.count + n] = labels
        self.count += n

    def close(self, **marker) -> Dict:
        """Write the shard; the marker (count, checksums plus `marker`) goes last so it means 'complete'.

        A shard whose every image was skipped gets its marker only: it is done, but holds nothing to list."""
        sums = {}
        if self.count:
            # The checksums of the bytes as written go to the marker, then the manifest (see checksums.py).
            data = _atomic_npy(os.path.join(self.root, f"{self.name}.npy"), self.data[:self.count])
            labels = _atomic_npy(os.path.join(self.root, f"{self.name}.labels.npy"), self.labels[:self.count])
            sums = {**data, "labels_sha256": labels["sha256"]}
        marker = {"name": self.name, "count": int(self.count), **sums, **marker}
        _atomic_json(os.path.join(self.root, f"{self.name}.json"), marker)
        self.data = self.labels = None
        return marker


def manifest_entry(marker: Dict) -> Dict:
    """A shard's entry in the manifest: name, count and the checksums its marker recorded."""
    return {k: v for k, v in marker.items() if k in ("name", "count", "bytes", "sha256", "labels_sha256")
            or k.endswith(("_bytes", "_sha256"))}


def write_manifest(root: str, **fields) -> Dict:
    """Write `root/manifest.json` from keyword fields (REQUIRED_KEYS less format/version)."""
    manifest = {"format": FORMAT, "version": VERSION, **fields}
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise ValueError(f"manifest is missing {missing}")
    _atomic_json(os.path.join(root, MANIFEST), manifest)
    return manifest


def read_manifest(path) -> Dict:
    """The manifest of a shard folder (or of the manifest file itself), checked for the required keys."""
    path = os.fspath(path)
    file = os.path.join(path, MANIFEST) if os.path.isdir(path) else path
    check_regular(file, DataError, "a shard manifest")
    try:
        with open(file, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise DataError(f"{file} does not exist; run `dit extract` or `dit data convert` into that folder") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {file} ({err}); check it is readable") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{file} is not valid JSON ({err.msg} at line {err.lineno}); re-run `dit extract`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{file} is not a {FORMAT} manifest; point at a folder written by `dit extract`")
    version = manifest.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DataError(f"{file}: version {version!r} is not a format version; re-run `dit extract`")
    if version > VERSION:
        raise DataError(f"{file} has format version {manifest['version']}; this dit-trainer reads {VERSION}, upgrade it")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise DataError(f"{file} lacks {', '.join(missing)}; re-run `dit extract` to rewrite it")
    if manifest["posterior"] not in POSTERIOR_KINDS:
        raise DataError(f"{file}: posterior {manifest['posterior']!r} is not one of {POSTERIOR_KINDS}")
    return manifest


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_manifest_values(file: str, m: Dict) -> None:
    """The values training relies on (`dit data verify` lists every problem; training stops at the first): float storage, a C×H×W shape, class count, plain shard names."""
    if m["dtype"] not in STORAGE_DTYPES:
        # An int8 manifest would read float latents truncated to integers.
        raise DataError(f"{file}: dtype {m['dtype']!r} is not one of {', '.join(STORAGE_DTYPES)}; re-run `dit extract`")
    shape = m["latent_shape"]
    if not isinstance(shape, list) or len(shape) != 3 or not all(_positive_int(s) for s in shape):
        raise DataError(f"{file}: latent_shape {shape!r} is not [C, H, W] of positive integers")
    if not _positive_int(m["num_classes"]):
        raise DataError(f"{file}: num_classes {m['num_classes']!r} is not a positive integer")
    # These fill the run's config (data.image_size, ...), which would fail later with a traceback.
    if m["image_size"] is not None and not _positive_int(m["image_size"]):
        raise DataError(f"{file}: image_size {m['image_size']!r} is not a positive integer; re-run `dit extract`")
    sf = m["scaling_factor"]
    if sf is not None and (isinstance(sf, bool) or not isinstance(sf, (int, float)) or not 0 < sf < float("inf")):
        raise DataError(f"{file}: scaling_factor {sf!r} is not a positive number; re-run `dit extract`")
    if m["vae"] is not None and not isinstance(m["vae"], str):
        raise DataError(f"{file}: vae {m['vae']!r} is not a VAE name or folder; re-run `dit extract`")
    if not isinstance(m["flips"], bool):
        raise DataError(f"{file}: flips {m['flips']!r} is not true or false; re-run `dit extract`")
    names = m["class_names"]
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise DataError(f"{file}: class_names is not a list of names")
    if not isinstance(m["count"], int) or isinstance(m["count"], bool) or m["count"] < 0:
        raise DataError(f"{file}: count {m['count']!r} is not a non-negative integer")
    if not isinstance(m["shards"], list):
        raise DataError(f"{file}: shards is not a list")
    for s in m["shards"]:
        name = s.get("name") if isinstance(s, dict) else None
        count = s.get("count") if isinstance(s, dict) else None
        if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", ".."):
            raise DataError(f"{file}: shard entry {s!r} does not name a file in the folder")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise DataError(f"{file}: shard {name} has count {count!r}, not a non-negative integer")


def entry_shape(manifest: Dict) -> tuple:
    """F×K×C×H×W of one shard row under `manifest`."""
    return (2 if manifest["flips"] else 1, 2 if manifest["posterior"] == "mean_std" else 1, *manifest["latent_shape"])


def _splitmix64(x: int) -> int:
    """SplitMix64's output function: a cheap, well-mixed 64-bit hash (Steele et al., 2014)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _raise_fd_limit(needed: int) -> None:
    # Each mmap holds a file descriptor: ~630 shards at ImageNet 256 plus the process's own files
    # come close to the usual soft limit of 1024.
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed + 256:
            target = needed + 256 if hard == resource.RLIM_INFINITY else min(hard, needed + 256)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


class LatentShards(Dataset):
    """Map-style dataset over a shard folder: (x float32 C×H×W, y int64), O(1) access via per-shard mmaps."""

    def __init__(self, path, random_flip: bool = True, sample_posterior: bool = True, seed: int = 0, remedy=None):
        """`remedy`: what a checksum mismatch tells the user to do (default: re-extract the shard)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
        self.root = os.fspath(path)
        self.manifest = read_manifest(self.root)
        m = self.manifest
        check_manifest_values(os.path.join(self.root, MANIFEST), m)
        self.latent_shape = tuple(int(s) for s in m["latent_shape"])
        self.num_classes = int(m["num_classes"])
        self.class_names = list(m["class_names"]) if m["class_names"] else None
        self.random_flip = bool(random_flip)
        self.sample_posterior = bool(sample_posterior) and m["posterior"] == "mean_std"
        self.seed = int(seed)
        self.epoch = 0
        self.names = [s["name"] for s in m["shards"]]
        counts = [int(s["count"]) for s in m["shards"]]
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        if int(self.offsets[-1]) != int(m["count"]):
            raise DataError(f"{self.root}/{MANIFEST}: shards hold {int(self.offsets[-1])} latents but count says "
                            f"{m['count']}; run `dit data verify`")
        self.remedy = remedy or "re-extract that shard (`dit extract`) or run `dit data verify`"
        # Sizes, then the content of every shard not verified in this version (checksums.py), before any step.
        checksums.verify_shard_files(self.root, m["shards"], self.remedy)
        sums = [s.get("labels_sha256") for s in m["shards"]]
        labels = [self._load_labels(name, n, want) for name, n, want in zip(self.names, counts, sums)]
        self.labels = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
        self._entry = entry_shape(m)
        # `dit extract --keep-images`: each item also carries its image once `return_images` is set (REPA).
        self.stored_images, self.return_images = bool(m.get("images")), False
        self._arrays: Dict[int, np.ndarray] = {}
        self._pid = os.getpid()
        self._generator: Optional[torch.Generator] = None
        _raise_fd_limit(len(self.names))

    def _load_labels(self, name: str, count: int, sha256=None) -> np.ndarray:
        path = os.path.join(self.root, f"{name}.labels.npy")
        check_regular(path, DataError, "shard labels")
        try:
            with open(path, "rb") as f:
                raw = f.read()
            checksums.check_bytes(path, raw, sha256, self.remedy)  # small: hashed on every open
            labels = read_array(io.BytesIO(raw))
        except (OSError, *NPY_ERRORS) as err:
            raise DataError(f"cannot read {path} ({one_line(err)}); re-extract that shard or run `dit data verify`") from None
        if labels.shape != (count,):
            raise DataError(f"{path} holds {labels.shape} labels, manifest says {count}; run `dit data verify`")
        if labels.dtype.kind not in "iu":
            raise DataError(f"{path} holds {labels.dtype} labels; labels are integer class ids, run `dit data verify`")
        bad = np.flatnonzero((labels < 0) | (labels >= self.num_classes))
        if bad.size:
            raise DataError(f"{path}: label {int(labels[bad[0]])} (row {int(bad[0])}) is outside 0..{self.num_classes - 1}; "
                            "run `dit data verify`")
        return labels.astype(np.int64, copy=False)

    def read_images_from(self, paths) -> None:
        """Give items the images of `paths` (the image folder this latent cache was made of), read from there."""
        self.image_paths, self.stored_images = paths, True

    def __getstate__(self):
        # Workers reopen their own mmaps; pickling open memmaps would copy whole shards.
        state = dict(self.__dict__)
        state["_arrays"], state["_generator"], state["_images"] = {}, None, {}
        return state

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose flips and posterior noise `__getitem__` draws."""
        self.epoch = check_epoch(epoch)

    def _array(self, shard: int) -> np.ndarray:
        if self._pid != os.getpid():
            self._arrays, self._generator, self._pid, self._images = {}, None, os.getpid(), {}
        array = self._arrays.get(shard)
        if array is None:
            path = os.path.join(self.root, f"{self.names[shard]}.npy")
            check_regular(path, DataError, "a shard")
            try:
                array = open_memmap(path)
            except (OSError, *NPY_ERRORS) as err:
                raise DataError(f"cannot open {path} ({one_line(err)}); re-extract that shard or run `dit data verify`") from None
            want = (int(self.offsets[shard + 1] - self.offsets[shard]), *self._entry)
            if array.shape != want:
                raise DataError(f"{path} has shape {array.shape}, manifest says {want}; run `dit data verify`")
            if array.dtype != np.dtype(self.manifest["dtype"]):
                raise DataError(f"{path} holds {array.dtype}, manifest says {self.manifest['dtype']}; run `dit data verify`")
            self._arrays[shard] = array
        return array

    def locate(self, index: int):
        """(shard, row) of item `index`."""
        shard = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return shard, index - int(self.offsets[shard])

    def _draws(self, index: int, base: Optional[int] = None):
        """(flip, noise seed or None) of item `index` in the current epoch; `base` caches the epoch's hash."""
        return item_draw(self.seed, self.epoch, index, self.random_flip, self.sample_posterior, base)

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def check_indices(self, indices: Sequence[int]) -> np.ndarray:
        """`indices` as non-negative int64 positions, or IndexError."""
        n = len(self)
        index = np.asarray([int(i) for i in indices], dtype=np.int64)
        index = np.where(index < 0, index + n, index)
        if index.size and (index.min() < 0 or index.max() >= n):
            raise IndexError(f"index {int(index[(index < 0) | (index >= n)][0])} out of range for {n} items")
        return index

    def __getitems__(self, indices: Sequence[int]) -> List:
        """Items for a batch of indices; DataLoader calls this once per batch, amortising numpy/torch overhead."""
        index = self.check_indices(indices)
        draws = epoch_draws(self.seed, self.epoch, index, self.random_flip, self.sample_posterior)
        variant = draws[0].astype(np.int64) if self._entry[0] == 2 else np.zeros(len(index), dtype=np.int64)
        shard_of = np.searchsorted(self.offsets, index, side="right") - 1
        kinds = 2 if self.sample_posterior else 1
        for shard in np.unique(shard_of):
            self._array(int(shard))  # its shape checked against the manifest before rows are sized by it
        rows = np.empty((len(index), kinds, *self.latent_shape), dtype=self.manifest["dtype"])
        for shard in np.unique(shard_of):
            where = np.flatnonzero(shard_of == shard)
            local = index[where] - self.offsets[shard]
            # Plain ndarray view: np.memmap's subclass hooks cost microseconds per indexing.
            rows[where] = np.asarray(self._array(int(shard)))[local, variant[where], :kinds]
        if self._generator is None:
            self._generator = torch.Generator()
        x = latents_from_rows(rows, draws, self._entry[0] == 2, self._generator)
        finite = torch.isfinite(x).flatten(1).all(1)
        if not bool(finite.all()):
            i = int(index[int((~finite).nonzero()[0])])
            shard, row = self.locate(i)
            raise DataError(f"{self.root}/{self.names[shard]}.npy row {row} holds NaN or inf; run `dit data verify` "
                            "and re-extract that shard")
        y = torch.from_numpy(self.labels[index])
        if self.return_images:
            from dit_trainer.data.shard_images import batch_images

            images = batch_images(self, index, shard_of, draws[0])
            return [{"x": a, "y": b, "image": c} for a, b, c in zip(x.unbind(0), y.unbind(0), images.unbind(0))]
        return list(zip(x.unbind(0), y.unbind(0)))


def item_draw(seed: int, epoch: int, index: int, random_flip: bool, sample_posterior: bool, base: Optional[int] = None):
    """(flip, noise seed or None) of item `index` in `epoch`; `base` caches the epoch's hash."""
    if base is None:
        base = _splitmix64(_splitmix64(seed) ^ epoch)
    state = _splitmix64(base ^ int(index))
    # Always drawn, so the noise does not depend on random_flip.
    flip = state >> 63 == 1 and random_flip
    return flip, _splitmix64(state) >> 1 if sample_posterior else None


def epoch_draws(seed: int, epoch: int, index, random_flip: bool, sample_posterior: bool):
    """(flips as a bool array, noise seeds or None per item) of the items `index` in `epoch`."""
    base = _splitmix64(_splitmix64(seed) ^ epoch)
    draws = [item_draw(seed, epoch, i, random_flip, sample_posterior, base) for i in np.asarray(index).tolist()]
    return np.array([f for f, _ in draws], dtype=bool), [s for _, s in draws]


def latents_from_rows(rows: np.ndarray, draws, stored_flips: bool, generator: torch.Generator) -> torch.Tensor:
    """float32 b×C×H×W latents from stored rows b×K×C×H×W (the variant `draws` flips already picked
    where flips are stored): the mean plus std·noise when K = 2, then flipped where none are stored."""
    flips, noise_seeds = draws
    # torch widens float16 several times faster than numpy does.
    rows = torch.from_numpy(rows).float()
    x = rows[:, 0]
    if rows.shape[1] == 2:
        eps = torch.empty(x.shape)
        for j, noise_seed in enumerate(noise_seeds):
            generator.manual_seed(noise_seed)
            torch.randn(x.shape[1:], generator=generator, out=eps[j])
        x.addcmul_(rows[:, 1], eps)
    if flips.any() and not stored_flips:
        # Without stored flips, mirroring the latent is the usual approximation of encoding the mirrored image.
        mask = torch.from_numpy(flips)
        x[mask] = x[mask].flip(-1)
    return x
