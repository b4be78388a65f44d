"""The latent cache of an image folder: where it lives, what names it, and what it holds so far.

A cache folder is named by a sha256 over everything that changes its bytes: the folder (absolute
path, every file's relative path, label, size, mtime, ctime and inode: a stat, no read), the image size, the VAE (a Hub id, or a
folder's config and weight files) and the VAE's compute dtype. Another folder, size or VAE is
another cache; the same ones, from any run, find this one.

While incomplete it holds `pieces/`: each a `<id>.index.npy` (image indices), a `<id>.rows.npy`
(their rows, `dit extract`'s N×F×K×C×H×W float16 layout) and `<id>.sums.json` (both files' sizes
and sha256), each written to a temporary name and renamed, the sums last; a piece counts once its
sums exist and its files match them (checked as shards are, see `checksums`), so a run killed at any
instant leaves only whole pieces (and temporary files nobody reads), and a damaged piece's images
are encoded again. Complete, it is
a `dit extract` shard folder: shard i holds images [i·S, (i+1)·S), `manifest.json` written last.
"""

import contextlib
import hashlib
import io
import json
import os
import uuid
from typing import Dict, List, Optional

import numpy as np

from dit_trainer.data import shards as sh
from dit_trainer.data import checksums
from dit_trainer.data.checksums import file_sha256
from dit_trainer.data.shard_text import TextSidecar, fields_of
from dit_trainer.errors import DataError
from dit_trainer.npy import open_memmap, read_array

FORMAT = 1
PLAN = "cache.json"
PIECES = "pieces"
SUMS = ".sums.json"  # a piece's checksums, written last
SHARD_SIZE = 2048  # `dit extract`'s --shard-size default
PIECE_ROWS = 1024  # rows a rank keeps in memory before writing a piece: what a kill -9 can lose
STORAGE = "float16"  # `dit extract`'s --dtype default
ENTRY_FLIPS, ENTRY_KINDS = 2, 2  # both flips, posterior mean and std, as `dit extract` stores by default


def default_root() -> str:
    """Where caches go unless data.cache_dir says: $XDG_CACHE_HOME (or ~/.cache)/dit-trainer/latents."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dit-trainer", "latents")


def vae_identity(name: str):
    """What names a VAE's weights: a Hub id itself; for a folder its config's sha256 and each weight
    file's name, size and mtime (re-saving the VAE makes a new cache, the safe side)."""
    folder = os.path.expanduser(name)
    if not os.path.isdir(folder):
        return name
    if not os.path.isfile(os.path.join(folder, "config.json")) and os.path.isdir(os.path.join(folder, "vae")):
        folder = os.path.join(folder, "vae")
    files = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isfile(path):
            st = os.stat(path)
            files.append([entry, st.st_size, st.st_mtime_ns])
    config = os.path.join(folder, "config.json")
    return {"path": os.path.abspath(folder), "config": file_sha256(config) if os.path.isfile(config) else None,
            "files": files}


def files_digest(paths: List[str], labels: np.ndarray, root: str) -> str:
    """sha256 over each image's relative path, label, size, mtime, ctime and inode: an edited, swapped,
    added or removed image changes it, without reading a byte of any image.

    `cp -p` and `rsync -t` put the old mtime on a new file of the same size, but no tool can set a
    ctime (any write or rename sets it to now), and rsync's rename also brings a new inode. The price:
    `chmod`/`chown` of the images change their ctime too, and so make a new cache (the safe side)."""
    digest = hashlib.sha256()
    for path, label in zip(paths, labels.tolist()):
        try:
            st = os.stat(path)
        except OSError as err:
            raise DataError(f"{path}: cannot read it ({err.strerror or err}); restore it or remove it from "
                            f"{root}") from None
        line = f"{os.path.relpath(path, root)}\t{label}\t{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}\t{st.st_ino}\n"
        digest.update(line.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def cache_plan(data_path: str, paths, labels, vae_name: str, vae_dtype: str, image_size: int, files_sha256=None,
               text=None) -> Dict:
    """The values that name a cache, with its `key`; a captioned listing gives its own `files_sha256`
    (`Captioned.digest`) and `text`, what names its text encoder's outputs."""
    plan = {"format": FORMAT, "data_path": data_path if "://" in data_path else os.path.abspath(data_path),
            "num_images": len(paths), "files_sha256": files_sha256 or files_digest(paths, labels, data_path),
            "vae": vae_name, "vae_identity": vae_identity(vae_name), "vae_dtype": vae_dtype, "image_size": int(image_size),
            "shard_size": SHARD_SIZE, "flips": True, "posterior": "mean_std", "dtype": STORAGE,
            **({"text": text} if text else {})}
    plan["key"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
    return plan


def cache_folder(root: str, plan: Dict) -> str:
    """The cache folder of `plan` under `root`: folder name, image size and the key's first 12 digits."""
    name = os.path.basename(os.path.normpath(plan["data_path"].split("://")[-1])) or "images"
    return os.path.join(os.path.abspath(os.path.expanduser(root)), f"{name}-{plan['image_size']}px-{plan['key'][:12]}")


def read_plan(folder: str) -> Optional[Dict]:
    """The plan a cache folder recorded (with the VAE's shapes), or None where there is none yet."""
    path = os.path.join(folder, PLAN)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read {path} ({err}); delete {folder} to encode the images again") from None


def write_plan(folder: str, plan: Dict) -> None:
    """Record the plan (every rank may: the content is the same, the write atomic)."""
    with writing(folder, os.path.join(folder, PLAN)):
        os.makedirs(os.path.join(folder, PIECES), exist_ok=True)
        sh._atomic_json(os.path.join(folder, PLAN), plan)


@contextlib.contextmanager
def writing(folder: str, path: str, leftovers=()):
    """A failed write into the cache (a full disk, a quota, a read-only mount) as one DataError naming
    `path` and its file system's free space; `leftovers` (files of a half-written piece) are removed.
    Without it the trainer would blame its output_dir."""
    from dit_trainer.fs import write_error_text

    try:
        yield
    except OSError as err:
        for leftover in leftovers:
            with contextlib.suppress(OSError):
                os.remove(leftover)
        raise DataError(f"latent cache: {write_error_text(path, err)}; free space there or set data.cache_dir to "
                        f"a writable folder with room (the cache {folder} keeps what was written)") from None


def remedy(folder: str) -> str:
    """What to do about a damaged cache: it is only a cache."""
    return f"delete the latent cache folder {folder} (the next run encodes the images again)"


def num_shards(num_images: int) -> int:
    """Shards of a complete cache of `num_images` images."""
    return -(-num_images // SHARD_SIZE)


class Where:
    """Where each image's rows are: `file_of[i]` indexes `files` (-1: not encoded yet), `row_of[i]` the row."""

    def __init__(self, files: List[str], file_of: np.ndarray, row_of: np.ndarray):
        self.files, self.file_of, self.row_of = files, file_of, row_of

    @property
    def covered(self) -> int:
        """Images whose rows are on disk."""
        return int((self.file_of >= 0).sum())


def _rows_shape(path: str):
    from dit_trainer.data.latents import read_npy_header

    try:
        return read_npy_header(path)[0]
    except DataError:
        return None


def scan(folder: str, num_images: int, entry: tuple) -> Where:
    """The rows on disk: finished shards, then whole pieces; a damaged or foreign piece is passed over
    (its images are encoded again), never read."""
    files: List[str] = []
    file_of = np.full(num_images, -1, dtype=np.int32)
    row_of = np.zeros(num_images, dtype=np.int64)
    total = num_shards(num_images)
    for s in range(total):
        name = sh.shard_name(s, total)
        start, stop = s * SHARD_SIZE, min((s + 1) * SHARD_SIZE, num_images)
        path = os.path.join(folder, f"{name}.npy")
        if sh.shard_done(folder, name) and _rows_shape(path) == (stop - start, *entry):
            file_of[start:stop], row_of[start:stop] = len(files), np.arange(stop - start)
            files.append(path)
    pieces = os.path.join(folder, PIECES)
    names = sorted(n for n in os.listdir(pieces) if n.endswith(SUMS)) if os.path.isdir(pieces) else []
    for name in names:
        stem = name[:-len(SUMS)]
        index = _piece_index(pieces, stem)
        rows = os.path.join(pieces, f"{stem}.rows.npy")
        if (index is None or index.ndim != 1 or index.dtype.kind not in "iu" or _rows_shape(rows) != (len(index), *entry)
                or (index.size and (index.min() < 0 or index.max() >= num_images))):
            continue
        fresh = file_of[index] < 0
        if fresh.any():
            file_of[index[fresh]], row_of[index[fresh]] = len(files), np.flatnonzero(fresh)
            files.append(rows)
    return Where(files, file_of, row_of)


def _piece_index(pieces: str, stem: str) -> Optional[np.ndarray]:
    """The image indices of a whole piece whose files match the checksums written with it, else None."""
    try:
        with open(os.path.join(pieces, stem + SUMS), encoding="utf-8") as f:
            sums = json.load(f)
        checksums.verify_shard_files(pieces, [{"name": f"{stem}.rows", **sums["rows"]}], "")
        path = os.path.join(pieces, f"{stem}.index.npy")
        with open(path, "rb") as f:
            raw = f.read()
        checksums.check_bytes(path, raw, sums["index"]["sha256"], "")
        return read_array(io.BytesIO(raw))
    except (OSError, ValueError, EOFError, KeyError, TypeError):  # DataError is a ValueError
        return None


class PieceWriter:
    """Collects one rank's encoded rows and writes them as whole pieces of about PIECE_ROWS rows."""

    def __init__(self, folder: str):
        self.folder = os.path.join(folder, PIECES)
        self.index: List[np.ndarray] = []
        self.rows: List[np.ndarray] = []
        self.extra: Dict[str, List[np.ndarray]] = {}
        self.pending = 0

    def add(self, index: np.ndarray, rows: np.ndarray, extra: Optional[Dict[str, np.ndarray]] = None) -> None:
        """Keep rows (float16, b×F×K×C×H×W) of images `index`, and `extra` rows of other fields (the text
        encoder's, `shard_text`) written beside them; write a piece once enough are kept."""
        self.index.append(np.asarray(index, dtype=np.int64))
        self.rows.append(rows)
        for field, value in (extra or {}).items():
            self.extra.setdefault(field, []).append(value)
        self.pending += len(index)
        if self.pending >= PIECE_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write what is kept as one piece: indices, rows, then their checksums (whose rename makes it count)."""
        if not self.pending:
            return
        name = uuid.uuid4().hex
        stem = os.path.join(self.folder, name)
        # A piece without its checksums never counts; its files are removed all the same.
        files = [f"{stem}.index.npy", f"{stem}.rows.npy"] + [sidecar(f"{stem}.rows.npy", f) for f in self.extra]
        with writing(os.path.dirname(self.folder), f"{stem}.rows.npy", files):
            os.makedirs(self.folder, exist_ok=True)
            sums = {"index": sh._atomic_npy(f"{stem}.index.npy", np.concatenate(self.index)),
                    "rows": sh._atomic_npy(f"{stem}.rows.npy", np.concatenate(self.rows))}
            for field, parts in self.extra.items():
                done = sh._atomic_npy(sidecar(f"{stem}.rows.npy", field), np.concatenate(parts))
                sums["rows"].update({f"{field}_bytes": done["bytes"], f"{field}_sha256": done["sha256"]})
            sh._atomic_json(stem + SUMS, sums)
        checksums.stamp_written(self.folder, [{"name": f"{name}.rows", **sums["rows"]}])
        self.index, self.rows, self.extra, self.pending = [], [], {}, 0


def sidecar(rows_path: str, field: str) -> str:
    """The file of `field` beside a rows file (a shard's `NAME.npy` or a piece's `ID.rows.npy`)."""
    return rows_path[:-len(".npy")] + checksums.SIDECARS[field]


def gather(where: Where, index: np.ndarray, opened: Dict, select=None, field: Optional[str] = None) -> np.ndarray:
    """The stored rows of images `index` (all covered), `select` (a function of a rows view) applied per
    file; with `field`, the rows of that field beside them instead."""
    out = None
    file_of = where.file_of[index]
    for f in np.unique(file_of):
        at = np.flatnonzero(file_of == f)
        slot = int(f) if field is None else (int(f), field)
        array = opened.get(slot)
        if array is None:
            path = where.files[int(f)]
            array = opened[slot] = open_memmap(path if field is None else sidecar(path, field))
        # Plain ndarray view: np.memmap's subclass hooks cost microseconds per indexing.
        part = np.asarray(array)[where.row_of[index[at]]]
        part = select(part, at) if select is not None else part
        if out is None:
            out = np.empty((len(index), *part.shape[1:]), dtype=part.dtype)
        out[at] = part
    return out


def pack(folder: str, where: Where, shard_ids, labels: np.ndarray, text: Optional[Dict] = None) -> None:
    """Write shards `shard_ids` from the rows on disk, as `dit extract` would have written them (with
    the text encoder's outputs beside them, with `text`, a manifest's text record)."""
    num_images = len(labels)
    total = num_shards(num_images)
    opened: Dict[int, np.ndarray] = {}
    for s in shard_ids:
        name = sh.shard_name(s, total)
        if sh.shard_done(folder, name):
            continue
        index = np.arange(s * SHARD_SIZE, min((s + 1) * SHARD_SIZE, num_images))
        rows = gather(where, index, opened)
        writer = sh.ShardWriter(folder, name, len(index), rows.shape[1:], STORAGE)
        writer.add(rows, labels[index])
        marker = {}
        with writing(folder, os.path.join(folder, f"{name}.npy")):
            if text is not None:
                beside = TextSidecar(folder, name, len(index), text)
                beside.add({f: gather(where, index, opened, field=f) for f in fields_of(text)})
                marker = beside.close()
            writer.close(skipped=[], rank=int(os.environ.get("RANK", "0")), **marker)


def read_manifest_or_none(folder: str) -> Optional[Dict]:
    """The manifest of a complete cache, or None while it is incomplete."""
    if not os.path.isfile(os.path.join(folder, sh.MANIFEST)):
        return None
    return sh.read_manifest(folder)


def remove_pieces(folder: str) -> None:
    """Drop the pieces of a cache whose shards and manifest are written."""
    import shutil

    shutil.rmtree(os.path.join(folder, PIECES), ignore_errors=True)
