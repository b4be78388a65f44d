"""`dit data convert` (per-file latents → shards) and `dit data verify` (check a shard folder)."""

import glob
import math
import os
from typing import Dict, List, Optional

import numpy as np

from dit_trainer.data import checksums
from dit_trainer.data import shard_text
from dit_trainer.data import shards as sh
from dit_trainer.data.indexing import NPY_ERRORS
from dit_trainer.errors import DataError, one_line
from dit_trainer.fs import not_regular
from dit_trainer.npy import open_memmap, read_array

# Rows checked for NaN/inf per read: bounds memory at ImageNet scale without per-row overhead.
_SCAN_ROWS = 512


def open_per_file_latents(src: str, num_classes: Optional[int] = None, labels_file=None, unconditional: bool = False):
    """The per-file dataset at `src`: fast-DiT/PaddleMIX features or a folder of `.npy` latents.

    A `.npy` folder without a labels file is refused unless `unconditional` (one class), as `dit
    train` refuses it: packed into shards, the labels someone forgot would be lost for good.
    """
    from dit_trainer.data.labels import find_labels_file
    from dit_trainer.data.latents import FASTDIT_FEATURES, FASTDIT_LABELS, FastDiTFeatures, NpyLatentFolder

    if os.path.isfile(os.path.join(src, sh.MANIFEST)):
        raise DataError(f"{src} already holds shards ({sh.MANIFEST}); nothing to convert")
    parent, base = os.path.split(os.path.normpath(src))
    if os.path.isdir(os.path.join(src, FASTDIT_FEATURES)):
        return FastDiTFeatures(src, num_classes=num_classes)
    if base == FASTDIT_FEATURES and os.path.isdir(os.path.join(parent, FASTDIT_LABELS)):
        return FastDiTFeatures(parent, num_classes=num_classes)
    if not unconditional and labels_file is None and os.path.isdir(src) and find_labels_file(src) is None:
        raise DataError(f"{src} has no labels file (labels.json|.npy|.txt beside the latents); write one, pass "
                        f"--labels-file, or --unconditional to pack one class")
    return NpyLatentFolder(src, num_classes=num_classes, labels_file=labels_file, unconditional=bool(unconditional))


def convert(src, out, shard_size: int = 4096, dtype: str = "float16", num_classes: Optional[int] = None,
            labels_file=None, vae: Optional[str] = None, scaling_factor: float = 0.18215,
            image_size: Optional[int] = None, progress: bool = True, unconditional: bool = False) -> Dict:
    """Pack the per-file latents at `src` into shards under `out`; returns the manifest."""
    src, out = os.fspath(src), os.fspath(out)
    if shard_size < 1:
        raise DataError("--shard-size must be >= 1")
    ds = open_per_file_latents(src, num_classes, labels_file, unconditional)
    if os.path.isfile(os.path.join(out, sh.MANIFEST)):
        raise DataError(f"{out} already holds shards; pass another --out or delete it")
    os.makedirs(out, exist_ok=True)
    n = len(ds)
    num_shards = math.ceil(n / shard_size)
    # Stored latents were one posterior sample, possibly of a randomly flipped image (fast-DiT bakes
    # one flip in), so they are recorded as samples without stored flips.
    entry = (1, 1, *ds.latent_shape)
    from dit_trainer.progress import progress_bar

    markers = []
    with progress_bar(total=n, unit="latent", desc="convert", disable=not progress, mininterval=1.0) as bar:
        for s in range(num_shards):
            lo, hi = s * shard_size, min((s + 1) * shard_size, n)
            writer = sh.ShardWriter(out, sh.shard_name(s, num_shards), hi - lo, entry, dtype)
            for i in range(lo, hi):
                x = ds.load_latent(i)
                if not np.isfinite(x).all():
                    raise DataError(f"{ds.paths[i]} contains NaN or inf; re-extract it or delete it")
                writer.add(x[None, None, None], ds.labels[i:i + 1])
            markers.append(writer.close(source=src))
            bar.update(hi - lo)
    return sh.write_manifest(
        out, count=n, latent_shape=list(ds.latent_shape), dtype=dtype, num_classes=int(ds.num_classes),
        class_names=ds.class_names, vae=vae, scaling_factor=float(scaling_factor),
        shift_factor=0.0, image_size=image_size or 8 * int(ds.latent_shape[-1]), flips=False,
        posterior="sample", shards=[sh.manifest_entry(m) for m in markers],
        skipped=0, source=os.path.abspath(src),
    )


def _check_manifest(m: Dict, file: str) -> List[str]:
    problems = []

    def bad(key, want):
        problems.append(f"{file}: {key}={m.get(key)!r}, expected {want}")

    if not isinstance(m["count"], int) or m["count"] < 0:
        bad("count", "a non-negative integer")
    shape = m["latent_shape"]
    if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(s, int) and s > 0 for s in shape)):
        bad("latent_shape", "[C, H, W] of positive integers")
    if m["dtype"] not in sh.STORAGE_DTYPES:
        bad("dtype", f"one of {sh.STORAGE_DTYPES}")
    if not isinstance(m["num_classes"], int) or m["num_classes"] < 1:
        bad("num_classes", "a positive integer")
    names = m["class_names"]
    if names is not None and (not isinstance(names, list) or len(names) != m["num_classes"]):
        bad("class_names", f"null or a list of num_classes ({m['num_classes']}) names")
    if not isinstance(m["scaling_factor"], (int, float)) or not m["scaling_factor"] > 0:
        bad("scaling_factor", "a positive number")
    if not isinstance(m["flips"], bool):
        bad("flips", "true or false")
    shard_list = m["shards"]
    if not isinstance(shard_list, list) or not all(
            isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("count"), int) for s in shard_list):
        bad("shards", 'a list of {"name": ..., "count": ...}')
    elif sum(s["count"] for s in shard_list) != m["count"]:
        problems.append(f"{file}: shards hold {sum(s['count'] for s in shard_list)} latents but count is {m['count']}")
    elif len({s["name"] for s in shard_list}) != len(shard_list):
        problems.append(f"{file}: a shard is listed twice")
    return problems


def _check_shard(root: str, m: Dict, name: str, count: int, entry: tuple) -> List[str]:
    problems = []
    path = os.path.join(root, f"{name}.npy")
    if not_regular(path) or not_regular(os.path.join(root, f"{name}.labels.npy")):
        return [f"{path} or its labels file is not a regular file (a FIFO or device); re-extract this shard"]
    try:
        data = open_memmap(path)
    except (OSError, *NPY_ERRORS) as err:
        return [f"{path}: cannot open ({one_line(err)}); re-extract this shard"]
    if data.shape != (count, *entry):
        problems.append(f"{path}: shape {data.shape}, manifest expects {(count, *entry)}")
    if data.dtype != np.dtype(m["dtype"]):
        problems.append(f"{path}: dtype {data.dtype}, manifest says {m['dtype']}")
    lpath = os.path.join(root, f"{name}.labels.npy")
    try:
        with open(lpath, "rb") as f:
            labels = read_array(f)
        if labels.shape != (count,):
            problems.append(f"{lpath}: shape {labels.shape}, manifest expects ({count},)")
        elif labels.dtype.kind not in "iu":
            problems.append(f"{lpath}: dtype {labels.dtype}, expected integers")
        elif count and (labels.min() < 0 or labels.max() >= m["num_classes"]):
            problems.append(f"{lpath}: labels span {labels.min()}..{labels.max()}, outside 0..{m['num_classes'] - 1}")
    except (OSError, *NPY_ERRORS) as err:
        problems.append(f"{lpath}: cannot read ({one_line(err)}); re-extract this shard")
    if problems or data.ndim != 6:
        return problems
    for lo in range(0, len(data), _SCAN_ROWS):
        block = np.asarray(data[lo:lo + _SCAN_ROWS], dtype=np.float32)
        finite = np.isfinite(block.reshape(len(block), -1)).all(axis=1)
        if not finite.all():
            problems.append(f"{path}: row {lo + int(np.flatnonzero(~finite)[0])} holds NaN or inf; re-extract this shard")
            break
        if m["posterior"] == "mean_std" and (block[:, :, 1] < 0).any():
            problems.append(f"{path}: negative posterior std near row {lo}; re-extract this shard")
            break
    return problems


def _check_sums(root: str, entry: Dict) -> List[str]:
    """The shard's bytes against the checksums its manifest records: every file hashed, whatever its stat."""
    remedy = "re-extract this shard (or delete the latent cache folder)"
    try:
        checksums.verify_shard_files(root, [entry], remedy, full=True)
        lpath = os.path.join(root, f"{entry['name']}.labels.npy")
        if entry.get("labels_sha256") is not None and checksums.file_sha256(lpath) != entry["labels_sha256"]:
            return [f"{lpath} does not match the sha256 in its manifest; {remedy}"]
    except (DataError, OSError) as err:
        return [str(err)]
    return []


def is_per_file_folder(path) -> bool:
    """Whether `path` is latents without shards: fast-DiT/PaddleMIX features or a folder of `.npy` files."""
    from dit_trainer.data.latents import FASTDIT_FEATURES

    root = os.fspath(path)
    if not os.path.isdir(root) or os.path.isfile(os.path.join(root, sh.MANIFEST)):
        return False
    return os.path.isdir(os.path.join(root, FASTDIT_FEATURES)) or os.path.basename(os.path.normpath(root)) == FASTDIT_FEATURES \
        or bool(glob.glob(os.path.join(root, "*.npy")))


def verify_per_file(path, labels_file=None, unconditional: bool = False, progress: bool = False):
    """(problems, the dataset) of per-file latents at `path`: what `dit train` reads them as, every file
    read once for its shape, dtype and NaN/inf; the dataset is None when it cannot be opened."""
    try:
        ds = open_per_file_latents(os.fspath(path), labels_file=labels_file, unconditional=unconditional)
    except DataError as err:
        return [str(err)], None
    from dit_trainer.progress import progress_bar

    problems = []
    for i in progress_bar(range(len(ds)), unit="latent", desc="verify", disable=not progress, mininterval=1.0):
        try:
            ds.load_latent(i)
        except DataError as err:
            problems.append(str(err))
    return problems, ds


def verify(path, progress: bool = False) -> List[str]:
    """Every problem found in the shard folder `path`, one line each; empty when it is sound."""
    root = os.fspath(path)
    file = os.path.join(root, sh.MANIFEST)
    try:
        m = sh.read_manifest(root)
    except DataError as err:
        return [str(err)]
    problems = _check_manifest(m, file)
    if problems:
        return problems
    entry = sh.entry_shape(m)
    listed = {s["name"] for s in m["shards"]}
    from dit_trainer.progress import progress_bar

    text = m.get("text")
    problems += shard_text.text_problems(file, text) if text is not None else []
    if problems:
        return problems
    for s in progress_bar(m["shards"], unit="shard", desc="verify", disable=not progress):
        problems += (_check_shard(root, m, s["name"], s["count"], entry) or _check_sums(root, s)
                     or (shard_text.check_shard_text(root, text, s["name"], s["count"]) if text else []))
    problems += shard_text.null_problems(root, text) if text is not None else []
    for stray in sorted(glob.glob(os.path.join(root, "shard-*.npy"))):
        stem = os.path.basename(stray)
        # What `dit extract` keeps beside the latents: labels, crops (--keep-images), text (--text-encoder).
        for suffix in (".labels.npy", *checksums.SIDECARS.values(), ".npy"):
            stem = stem.removesuffix(suffix)
        if stem not in listed:
            problems.append(f"{stray}: not listed in {file}; delete it or re-run the extraction")
    return problems
