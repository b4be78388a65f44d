"""The text encoder's outputs beside a shard's latents (`dit extract --text-encoder`, and an image
folder's latent cache trained with `data.text_encoder`).

Each shard `NAME` then has `NAME.text_embeds.npy` (N×L×D), `NAME.text_mask.npy` (N×L uint8, 1 = token)
and, for an encoder with a pooled projection (CLIP), `NAME.text_pooled.npy` (N×P), row i the caption
of latent row i; their sizes and sha256 are in the shard's manifest entry as its latents' are. The
manifest's `text` records the encoder (name, kind, max length, compute dtype, sizes), the storage
dtype and `null_text.safetensors`: the encoding of "" (the null caption of classifier-free
guidance), stored beside the shards so training on them never needs the text encoder.
"""

import hashlib
import os
from typing import Dict, List

import numpy as np
import torch

from dit_trainer.data import checksums
from dit_trainer.data.atomic import atomic_npy, atomic_write
from dit_trainer.errors import DataError, one_line
from dit_trainer.fs import check_regular
from dit_trainer.npy import open_memmap

FIELDS = ("text_embeds", "text_mask", "text_pooled")
NULL_FILE = "null_text.safetensors"
RECORD_KEYS = ("encoder", "kind", "max_length", "dtype", "hidden_size", "pooled_size", "storage", "null")


def suffix(field: str) -> str:
    """The file suffix of `field` beside a shard (or a cache piece's rows)."""
    return checksums.SIDECARS[field]


def fields_of(text: Dict) -> tuple:
    """The fields a text record's shards hold."""
    return FIELDS if text.get("pooled_size") else FIELDS[:2]


def row_shape(text: Dict, field: str) -> tuple:
    """The shape of one row of `field`."""
    return {"text_embeds": (text["max_length"], text["hidden_size"]), "text_mask": (text["max_length"],),
            "text_pooled": (text.get("pooled_size"),)}[field]


def storage_of(text: Dict, field: str) -> str:
    """The dtype `field` is stored in: masks uint8, the rest the record's storage dtype."""
    return "uint8" if field == "text_mask" else text["storage"]


def record(encoder, storage: str) -> Dict:
    """A manifest's `text` record of `encoder`'s outputs stored as `storage` (null file to be added)."""
    ident = encoder.identity()
    return {"encoder": ident["name"], **{k: ident[k] for k in ("kind", "max_length", "dtype", "hidden_size",
                                                                  "pooled_size")}, "storage": storage, "null": None}


def to_storage(rows: Dict[str, np.ndarray], text: Dict, where: str) -> Dict[str, np.ndarray]:
    """`rows` cast to their storage dtypes; DataError where an embedding overflows it."""
    out = {}
    for field in fields_of(text):
        with np.errstate(over="ignore"):
            out[field] = np.asarray(rows[field]).astype(storage_of(text, field), copy=False)
        if field != "text_mask" and not np.isfinite(out[field]).all():
            raise DataError(f"{where}: the text encoder's outputs are not finite in {text['storage']} (NaN, or beyond "
                            "its range); store float32 (dit extract --dtype float32) or encode in fp32")
    return out


class TextSidecar:
    """Buffers one shard's text rows, then writes them (before the shard's marker, which means 'complete')."""

    def __init__(self, root: str, name: str, capacity: int, text: Dict):
        self.root, self.name, self.text = root, name, text
        self.data = {f: np.empty((capacity, *row_shape(text, f)), dtype=storage_of(text, f)) for f in fields_of(text)}
        self.count = 0

    def add(self, rows: Dict[str, np.ndarray]) -> None:
        """Append rows (the ones the shard keeps, in its order)."""
        rows = to_storage(rows, self.text, f"{self.root}/{self.name}")
        n = len(rows["text_mask"])
        for field, array in self.data.items():
            array[self.count:self.count + n] = rows[field]
        self.count += n

    def close(self) -> Dict:
        """Write the arrays; returns their checksum fields for the shard's marker (none when empty)."""
        marker = {}
        for field, array in (self.data.items() if self.count else ()):
            sums = atomic_npy(os.path.join(self.root, self.name + suffix(field)), array[:self.count])
            marker.update({f"{field}_bytes": sums["bytes"], f"{field}_sha256": sums["sha256"]})
        self.data = None
        return marker


def write_null(root: str, rows: Dict[str, np.ndarray], text: Dict) -> Dict:
    """Write the encoding of "" (rows of one caption) as NULL_FILE; returns its manifest record."""
    from safetensors.numpy import save

    stored = to_storage(rows, text, os.path.join(root, NULL_FILE))
    data = save({k: np.ascontiguousarray(v[0]) for k, v in stored.items()})
    atomic_write(os.path.join(root, NULL_FILE), "wb", lambda f: f.write(data))
    return {"file": NULL_FILE, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_null(root: str, text: Dict, remedy: str) -> Dict[str, torch.Tensor]:
    """The null caption's encoding: {"text_embeds" (L, D), "text_mask" (L,) int64[, "text_pooled" (P,)]}."""
    from safetensors.numpy import load

    null = text["null"]
    path = os.path.join(root, NULL_FILE)
    check_regular(path, DataError, "the null caption's encoding")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        checksums.check_bytes(path, raw, null.get("sha256"), remedy)
        arrays = load(raw)
    except (OSError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"cannot read {path} ({one_line(err)}); {remedy}") from None
    out = {}
    for field in fields_of(text):
        array = arrays.get(field)
        if array is None or array.shape != row_shape(text, field) or array.dtype != np.dtype(storage_of(text, field)):
            raise DataError(f"{path}: {field} is not {storage_of(text, field)} {row_shape(text, field)}; {remedy}")
        out[field] = torch.from_numpy(array.astype(np.int64) if field == "text_mask" else array)
    return out


def text_problems(file: str, text) -> List[str]:
    """What is wrong with a manifest's `text` record (empty when it is sound)."""
    if not isinstance(text, dict) or any(k not in text for k in RECORD_KEYS):
        return [f"{file}: text is not a record of {', '.join(RECORD_KEYS)}; re-run `dit extract`"]
    problems = []
    for key in ("max_length", "hidden_size") + (("pooled_size",) if text["pooled_size"] is not None else ()):
        value = text[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{file}: text.{key} {value!r} is not a positive integer; re-run `dit extract`")
    if text["storage"] not in ("float16", "float32"):
        problems.append(f"{file}: text.storage {text['storage']!r} is not float16 or float32; re-run `dit extract`")
    null = text["null"]
    if not isinstance(null, dict) or null.get("file") != NULL_FILE or not isinstance(null.get("sha256"), str):
        problems.append(f"{file}: text.null does not record {NULL_FILE} and its sha256; re-run `dit extract`")
    return problems


def open_field(root: str, name: str, field: str, count: int, text: Dict) -> np.ndarray:
    """A shard's `field` as a memmap, checked against the manifest's count and shape."""
    path = os.path.join(root, name + suffix(field))
    check_regular(path, DataError, "shard text")
    try:
        array = open_memmap(path)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot open {path} ({one_line(err)}); re-extract that shard or run `dit data verify`") from None
    want = (count, *row_shape(text, field))
    if array.shape != want or array.dtype != np.dtype(storage_of(text, field)):
        raise DataError(f"{path} holds {array.dtype} {array.shape}, the manifest says {storage_of(text, field)} {want}; "
                        "run `dit data verify`")
    return array


def batch_text(shards, index: np.ndarray, shard_of: np.ndarray) -> Dict[str, torch.Tensor]:
    """The text rows of items `index` of `shards` (a TextShards), masks as int64."""
    text = shards.text
    if shards.__dict__.get("_text_pid") != os.getpid():  # a forked worker maps its own files
        shards._text_arrays, shards._text_pid = {}, os.getpid()
    out = {f: np.empty((len(index), *row_shape(text, f)), dtype=storage_of(text, f)) for f in fields_of(text)}
    for shard in np.unique(shard_of):
        s = int(shard)
        where = np.flatnonzero(shard_of == shard)
        rows = index[where] - shards.offsets[s]
        for field in out:
            array = shards._text_arrays.get((s, field))
            if array is None:
                count = int(shards.offsets[s + 1] - shards.offsets[s])
                array = shards._text_arrays[(s, field)] = open_field(shards.root, shards.names[s], field, count, text)
            out[field][where] = np.asarray(array)[rows]
    return {f: torch.from_numpy(a.astype(np.int64) if f == "text_mask" else a) for f, a in out.items()}


def check_shard_text(root: str, text: Dict, name: str, count: int) -> List[str]:
    """`dit data verify` of one shard's text files: shapes, dtypes, finite embeddings, 0/1 masks."""
    problems = []
    for field in fields_of(text):
        try:
            array = open_field(root, name, field, count, text)
        except DataError as err:
            problems.append(str(err))
            continue
        path = os.path.join(root, name + suffix(field))
        for lo in range(0, count, 512):
            block = np.asarray(array[lo:lo + 512])
            bad = (block > 1) if field == "text_mask" else ~np.isfinite(block.reshape(len(block), -1)).all(axis=1)
            if bad.any():
                row = lo + int(np.flatnonzero(bad.reshape(len(block), -1).any(axis=1))[0])
                what = "a mask value other than 0 or 1" if field == "text_mask" else "NaN or inf"
                problems.append(f"{path}: row {row} holds {what}; re-extract this shard")
                break
    return problems


def null_problems(root: str, text: Dict) -> List[str]:
    """`dit data verify` of the null caption's file against its record."""
    try:
        read_null(root, text, "re-run `dit extract` (it rewrites the null caption)")
    except DataError as err:
        return [str(err)]
    return []

