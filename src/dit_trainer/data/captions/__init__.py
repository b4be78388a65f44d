"""Captioned images for text-to-image training, in three layouts that give the same items for the same
images and captions:

- a folder (nested or flat) with a caption beside each image: `NAME.txt`, or `NAME.json` with a
  `caption` field (what img2dataset writes);
- a JSONL or CSV manifest of (path, caption) rows, paths relative to the manifest's folder
  (`path`/`file_name`/`image` and `caption`/`text` fields);
- webdataset `.tar` shards (`KEY.jpg`/`.png` + `KEY.txt`), one shard or a folder of them;

each on a local disk or at an fsspec URL (file://, memory://, s3://, ...). `list_captioned(path)`
reads every caption up front (they are small; a bad one stops before any image is encoded) and
returns a `Captioned` listing; `files.read_image` reads its images.
An empty or missing caption is one line naming the file (`empty="error"`), or the image is left out
and counted (`empty="drop"`). Captions past the text encoder's length are truncated where they are
encoded (`TextEncoder.truncated` counts them).
"""

import hashlib
import os
import posixpath
from dataclasses import dataclass, field
from typing import List, Optional

from dit_trainer.data.captions.files import ref_name
from dit_trainer.data.captions.sources import MANIFEST_SUFFIXES, folder_rows, is_url, manifest_rows, url_fs
from dit_trainer.data.captions.webdataset import SUFFIX as TAR_SUFFIX, list_shards, tar_rows
from dit_trainer.errors import DataError

EMPTY_POLICIES = ("error", "drop")


@dataclass
class Captioned:
    """A captioned listing: per item its key, image reference (a local path, an fsspec URL, or a
    shard member (shard, offset, size, name)), caption and stamp (what changes when its image does)."""

    source: str
    keys: List[str] = field(default_factory=list)
    images: List = field(default_factory=list)
    captions: List[str] = field(default_factory=list)
    stamps: List[str] = field(default_factory=list)
    dropped: int = 0  # images left out for a missing or empty caption (empty="drop")
    first_dropped: Optional[str] = None

    def __len__(self) -> int:
        return len(self.keys)

    def where(self, index: int) -> str:
        """The image of item `index`, as a user finds it: a path, URL or `shard:member`."""
        return ref_name(self.images[index])

    def digest(self, stamps: bool = False) -> str:
        """sha256 over every item's key, image and caption (and stamp, with `stamps`): what names a listing."""
        sha = hashlib.sha256()
        for i, (key, caption) in enumerate(zip(self.keys, self.captions)):
            # Without stamps, what the listing holds wherever it is: the same folder resumed from another
            # working directory (or moved) is the same listing.
            image = self.where(i) if stamps else posixpath.basename(self.where(i))
            line = f"{key}\t{image}\t{self.stamps[i] if stamps else ''}\t{caption}\n"
            sha.update(line.encode("utf-8", "surrogateescape"))
        return sha.hexdigest()


def layout_of(path: str) -> str:
    """"manifest", "webdataset" or "folder": what `path` holds; DataError when it is none of them."""
    lower = path.lower().rstrip("/")
    if lower.endswith(MANIFEST_SUFFIXES):
        return "manifest"
    if lower.endswith(TAR_SUFFIX):
        return "webdataset"
    if is_url(path):
        fs, inner = url_fs(path)
        isdir = fs.isdir(inner)
    else:
        isdir = os.path.isdir(path)
    if not isdir:
        raise DataError(f"{path} is not a folder of captioned images, a {'/'.join(MANIFEST_SUFFIXES)} manifest or "
                        f"{TAR_SUFFIX} shards; check the path")
    return "webdataset" if list_shards(path) else "folder"


def list_captioned(path, empty: str = "error") -> Captioned:
    """The captioned images at `path` (any of the three layouts, local or URL)."""
    if empty not in EMPTY_POLICIES:
        raise DataError(f"empty_captions {empty!r} is not one of {', '.join(EMPTY_POLICIES)}")
    path = os.fspath(path)
    if not is_url(path) and not os.path.exists(path):
        raise DataError(f"{path} does not exist; pass a folder of captioned images, a manifest or .tar shards")
    layout = layout_of(path)
    rows = {"manifest": manifest_rows, "webdataset": tar_rows, "folder": folder_rows}[layout](path)
    out, seen = Captioned(path), {}
    for key, ref, caption, where, stamp in rows:
        if key in seen:  # a.jpg beside a.png: one caption file for two images
            raise DataError(f"{ref_name(ref)} and {seen[key]} are both image {key} (one name, two extensions); "
                            "rename one, with its caption")
        seen[key] = ref_name(ref)
        if not caption:
            if empty == "error":
                raise DataError(f"{where}: the caption of {key} is missing or empty; write one, or set "
                                "data.empty_captions drop (dit extract --empty-captions drop) to leave such images out")
            out.dropped += 1
            out.first_dropped = out.first_dropped or where
            continue
        out.keys.append(key)
        out.images.append(ref)
        out.captions.append(caption)
        out.stamps.append(stamp)
    if not out.keys:
        raise DataError(f"{path} holds no captioned images ({out.dropped} without a caption); check the path and the "
                        "captions")
    return out


def dropped_line(listing: Captioned) -> Optional[str]:
    """The log line for images left out for want of a caption, or None when none were."""
    if not listing.dropped:
        return None
    return (f"{listing.dropped} images without a caption left out (empty_captions drop), the first: "
            f"{listing.first_dropped}")
