"""Reuse by key for benchmarks/time_to_quality.py: a finished run or a written score is reused only
where every argument that changes it matches the key stored with it.

A key is a JSON object of those arguments; its digest names the run folder or score file, so other
arguments find another name and never an earlier result, and the key stored there is compared in
full before anything is reused (a digest alone could collide, or the file be edited).
"""

import hashlib
import json
from pathlib import Path


def canonical(key) -> str:
    """`key` as JSON with sorted keys: equal for equal keys, tuples and lists alike."""
    return json.dumps(key, sort_keys=True, default=str)


def digest(key) -> str:
    """A short digest of `key`: the suffix of the folder or file it names."""
    return hashlib.sha256(canonical(key).encode()).hexdigest()[:10]


def code_version(src: Path) -> str:
    """A digest of the files under `src` (names and bytes, compiled caches left out): what trains and samples."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(src).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(src)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def differing(stored, key, prefix="") -> list:
    """Dotted names of the fields where `stored` and `key` (JSON-like) differ."""
    if isinstance(stored, dict) and isinstance(key, dict):
        names = []
        for name in sorted(set(stored) | set(key)):
            names += differing(stored.get(name), key.get(name), f"{prefix}{name}.")
        return names
    return [] if canonical(stored) == canonical(key) else [prefix.rstrip(".") or "the key"]


def holds_key(path: Path, key) -> bool:
    """True when `path` holds `key`, False when there is no such file; one line (SystemExit) when it holds another."""
    path = Path(path)
    if not path.is_file():
        return False
    check_same(json.loads(path.read_text()), key, path)
    return True


def check_same(stored, key, where) -> None:
    """One line (SystemExit) naming the differing fields when `stored`, read from `where`, is not `key`."""
    if canonical(stored) != canonical(key):
        fields = ", ".join(differing(stored, json.loads(canonical(key))))
        raise SystemExit(f"{where} was written for other arguments ({fields} differ); move it away or choose another --out")


def write_key(path: Path, key) -> None:
    """Store `key` in `path` as JSON."""
    Path(path).write_text(json.dumps(key, indent=1, sort_keys=True, default=str) + "\n")
