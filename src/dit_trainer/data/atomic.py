"""Files of shard folders and latent caches written whole or not at all: a temporary name, fsync,
rename; a failed write (a full disk) removes its temporary file."""

import hashlib
import json
import os
from typing import Dict

import numpy as np


def atomic_write(path: str, mode: str, write) -> None:
    """`write(f)` into `path`.tmpPID, fsync, rename; on any failure the temporary file is removed."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


def atomic_json(path: str, data) -> None:
    """Write `data` as indented JSON at `path`."""
    def write(f):
        json.dump(data, f, indent=1)
        f.write("\n")

    atomic_write(path, "w", write)


class _Hashing:
    """A write-only file that hashes and counts what goes through to `f`."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data):
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.size += len(view)
        return self.f.write(data)


def atomic_npy(path: str, array: np.ndarray) -> Dict:
    """Write `array` as the `.npy` at `path`; returns its {"bytes", "sha256"} as written (for a manifest)."""
    record = {}

    def write(f):
        out = _Hashing(f)
        np.save(out, array, allow_pickle=False)
        record.update(bytes=out.size, sha256=out.sha.hexdigest())

    atomic_write(path, "wb", write)
    return record
