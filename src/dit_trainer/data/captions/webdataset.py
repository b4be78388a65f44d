"""Webdataset shards: uncompressed `.tar` files whose members sharing a key form one sample
(`KEY.jpg` + `KEY.txt`, or `KEY.json` with a `caption` field), local or at any fsspec URL.

A shard is indexed once (member headers only, seeking past the data) and its members are then read
in place by offset: nothing is ever extracted to disk. A member whose name could leave a folder it
were extracted to (absolute, or climbing with `..`), a link, or a device is refused in one line
naming the shard and the member: such a shard was made to attack an extractor, not to train on.
"""

import os
import re
import tarfile
from typing import Dict, Iterator, List

from dit_trainer.data.captions.sources import Row, file_stamp, is_url, url_fs
from dit_trainer.data.captions.text import MAX_CAPTION_BYTES, caption_text, json_caption, too_long
from dit_trainer.data.images import IMAGE_EXTENSIONS
from dit_trainer.errors import DataError

SUFFIX = ".tar"
IMAGE_EXTS = tuple(e.lstrip(".") for e in IMAGE_EXTENSIONS)
# webdataset's split of a member name: the key is everything before the first dot of the file name.
_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


def open_binary(path: str):
    """A binary file object of a local path or an fsspec URL."""
    if is_url(path):
        fs, inner = url_fs(path)
        return fs.open(inner, "rb")
    return open(path, "rb")


def list_shards(path: str) -> List[str]:
    """The `.tar` shards `path` names: itself, or those directly in the folder, sorted."""
    if path.lower().endswith(SUFFIX):
        return [path]
    if is_url(path):
        fs, root = url_fs(path)
        return sorted(fs.unstrip_protocol(p) for p in fs.ls(root, detail=False) if p.lower().endswith(SUFFIX))
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.lower().endswith(SUFFIX) and not n.startswith("."))


def _check_member(shard: str, member: tarfile.TarInfo) -> None:
    name = member.name
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts:
        raise DataError(f"{shard}: member {name!r} would leave the shard's folder (an absolute path or '..'); the shard "
                        "is unsafe and nothing was read from it: delete it, or rebuild it with plain member names")
    if member.issym() or member.islnk():
        raise DataError(f"{shard}: member {name!r} is a link (to {member.linkname!r}); rebuild the shard with the "
                        "files themselves")
    if not (member.isfile() or member.isdir()):
        raise DataError(f"{shard}: member {name!r} is a device or FIFO, not a file; rebuild the shard with files only")


def _index(shard: str) -> Dict[str, Dict[str, tarfile.TarInfo]]:
    """{key: {extension: member}} of one shard, in the order keys first appear."""
    samples: Dict[str, Dict[str, tarfile.TarInfo]] = {}
    try:
        with open_binary(shard) as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for member in tar:
                _check_member(shard, member)
                match = _KEY.match(member.name)
                if member.isdir() or match is None:
                    continue
                key, ext = match.group(1), match.group(2).lower()
                if ext in samples.setdefault(key, {}):
                    raise DataError(f"{shard}: member {member.name!r} appears twice; rebuild the shard with each "
                                    "file once")
                samples[key][ext] = member
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DataError(f"cannot read {shard} as an uncompressed tar shard ({err}); check the file (compressed "
                        "shards are not read: decompress them)") from None
    return samples


def _caption(f, shard: str, key: str, members: Dict[str, tarfile.TarInfo]):
    for ext in ("txt", "json"):
        member = members.get(ext)
        if member is None:
            continue
        where = f"{shard}:{member.name}"
        if member.size > MAX_CAPTION_BYTES:
            raise too_long(where, member.size)
        f.seek(member.offset_data)
        raw = f.read(member.size)
        return (caption_text(raw, where) if ext == "txt" else json_caption(raw, where)), where
    return None, f"{shard}:{key} (no txt member)"


def _image_member(members: dict):
    """A sample's image member: one of IMAGE_EXTS, else one whose extension ends in one ("v2.jpg": a dot in the
    file name, which webdataset's split gives to the extension and its decoders read by the last part)."""
    exact = next((members[e] for e in IMAGE_EXTS if e in members), None)
    if exact is not None:
        return exact
    return next((m for e, m in sorted(members.items()) if e.rsplit(".", 1)[-1].lower() in IMAGE_EXTS), None)


def tar_rows(path: str) -> Iterator[Row]:
    """A row per sample with an image member, shard by shard; image references are (shard, offset,
    size, member name), read in place."""
    shards = list_shards(path)
    if not shards:
        raise DataError(f"{path} holds no {SUFFIX} shards; pass a shard, or a folder of them")
    seen: Dict[str, str] = {}
    for shard in shards:
        samples = _index(shard)
        stamp_of_shard = file_stamp(shard)
        with open_binary(shard) as f:
            for key, members in samples.items():
                image = _image_member(members)
                if image is None:
                    continue
                if key in seen:
                    raise DataError(f"{shard}: sample {key!r} is also in {seen[key]}; give each sample one key")
                seen[key] = shard
                caption, where = _caption(f, shard, key, members)
                ref = (shard, image.offset_data, image.size, image.name)
                yield key, ref, caption, where, f"{stamp_of_shard}\t{image.offset_data}\t{image.size}"


def read_member(ref) -> bytes:
    """The bytes of a shard member (shard, offset, size, name)."""
    shard, offset, size, _ = ref
    with open_binary(shard) as f:
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise OSError(f"{shard} ends inside member {ref[3]}; the shard changed or is truncated")
    return data

