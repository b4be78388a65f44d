"""What a shard folder holds, proved: each shard's size and sha256 as written, kept in its manifest,
checked when the folder is opened for training.

Sizes are checked on every open (a stat). Contents are hashed once per version of a file: a file
whose sha256 matched is remembered in `verified.json` beside the shards by its size, mtime, ctime
and inode, and in the process; a file with another stat is hashed again. Tools that copy or rewrite
a file (`cp -p`, `rsync -t`, `np.save`, `dd conv=notrunc`) cannot restore its ctime, so a changed
shard is hashed before a step reads it, while an ImageNet cache (about 40 GB) is not re-read on
every run. `dit data verify` hashes every file whatever its stat. Label files are small: they are
hashed on every open.
"""

import hashlib
import json
import os
from typing import Dict, Optional

from dit_trainer.data.atomic import atomic_json
from dit_trainer.data.shard_images import SUFFIX as IMAGES_SUFFIX
from dit_trainer.errors import DataError

STAMPS = "verified.json"
_BLOCK = 1 << 22
_known: Dict[str, tuple] = {}  # path -> stat key of the file version hashed in this process


def file_sha256(path: str) -> str:
    """The sha256 of a file's bytes."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            sha.update(block)
    return sha.hexdigest()


def stat_key(st: os.stat_result) -> list:
    """What changes whenever a file's bytes are rewritten, whatever restores its mtime."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _stamps(root: str) -> Dict:
    try:
        with open(os.path.join(root, STAMPS), encoding="utf-8") as f:
            stamps = json.load(f)
        return stamps if isinstance(stamps, dict) else {}
    except (OSError, ValueError):
        return {}  # none yet, or damaged: the files are hashed again


def _save_stamps(root: str, stamps: Dict) -> None:
    try:
        atomic_json(os.path.join(root, STAMPS), stamps)
    except OSError:
        pass  # a read-only or full folder: the next open hashes again


def _mismatch(path: str, what: str, remedy: str) -> DataError:
    return DataError(f"{path} {what}: it was changed or damaged after it was written; {remedy}")


# Files beside a shard's latents, by the field that prefixes their `_bytes`/`_sha256` in its entry: the
# images `dit extract --keep-images` keeps, the text encoder's outputs (`shard_text`).
SIDECARS = {"images": IMAGES_SUFFIX, **{f: f".{f}.npy" for f in ("text_embeds", "text_mask", "text_pooled")}}


def _files(entry) -> list:
    """(file name, bytes, sha256) of each file of a manifest shard entry that records checksums: the
    latents, and the files kept beside them (SIDECARS)."""
    name = entry["name"]
    files = [(f"{name}.npy", entry.get("bytes"), entry.get("sha256"))]
    files += [(name + sfx, entry.get(f"{field}_bytes"), entry.get(f"{field}_sha256")) for field, sfx in SIDECARS.items()]
    # A file without either was written before shards had checksums (or without images).
    return [f for f in files if f[1] is not None or f[2] is not None]


def verify_shard_files(root: str, shards, remedy: str, full: bool = False) -> None:
    """Check each file of manifest `shards` that records `bytes`/`sha256` (a shard's latents and kept
    images): size always, content when its stat is not one already verified (every file with `full`).
    DataError names the first bad file."""
    stamps, changed, hashed = _stamps(root), False, 0
    for name, want_size, want_sha in (f for entry in shards for f in _files(entry)):
        path = os.path.join(root, name)
        try:
            st = os.stat(path)
        except OSError as err:
            raise DataError(f"cannot read {path} ({err.strerror or err}); {remedy}") from None
        if want_size is not None and st.st_size != want_size:
            raise _mismatch(path, f"is {st.st_size} bytes, its manifest says {want_size}", remedy)
        key = stat_key(st)
        if want_sha is None or (not full and (_known.get(path) == key or stamps.get(name) == key)):
            continue
        hashed += st.st_size
        if file_sha256(path) != want_sha:
            raise _mismatch(path, "does not match the sha256 in its manifest", remedy)
        _known[path] = stamps[name] = key
        changed = True
    if changed:
        _save_stamps(root, stamps)


def stamp_written(root: str, shards) -> None:
    """Record the shards just written (their checksums taken while writing) as verified."""
    stamps = _stamps(root)
    for name, _, sha in (f for entry in shards for f in _files(entry)):
        if sha is not None:
            path = os.path.join(root, name)
            try:
                _known[path] = stamps[name] = stat_key(os.stat(path))
            except OSError:
                continue
    _save_stamps(root, stamps)


def check_bytes(path: str, data: bytes, want: Optional[str], remedy: str) -> None:
    """DataError when the sha256 of `data` (the file at `path`, read) is not `want` (None: not recorded)."""
    if want is not None and hashlib.sha256(data).hexdigest() != want:
        raise _mismatch(path, "does not match the sha256 in its manifest", remedy)
