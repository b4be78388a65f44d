"""Captioned images in a folder (a caption file beside each image) or listed by a manifest, on a
local disk or any fsspec URL. Each yields rows (key, image reference, caption or None, where the
caption came from, stamp) for `captions.collect`.

Keys are the image's path relative to the folder (or manifest) without its extension, so a folder,
its manifest and its webdataset shards name each image alike. A manifest's paths are relative to its
folder: an absolute one or one that climbs out of it with `..` is refused, never followed."""

import csv
import io
import json
import os
import posixpath
from typing import Iterator, Tuple

from dit_trainer.data.captions.text import MAX_CAPTION_BYTES, caption_text, checked, json_caption, too_long
from dit_trainer.data.images import IMAGE_EXTENSIONS, walk_images
from dit_trainer.errors import DataError
from dit_trainer.fs import not_regular

MANIFEST_SUFFIXES = (".jsonl", ".csv")
PATH_FIELDS = ("path", "file_name", "image")  # file_name: Hugging Face's imagefolder metadata.jsonl
CAPTION_FIELDS = ("caption", "text")
CAPTION_SUFFIXES = (".txt", ".json")  # looked for in this order beside each image
# A manifest line past this is no (path, caption) row; reading it whole could take all memory.
MAX_LINE_BYTES = MAX_CAPTION_BYTES + 4096

Row = Tuple[str, object, object, str, str]


def is_url(path: str) -> bool:
    """Whether `path` is an fsspec URL (file://, memory://, s3://, ...) rather than a local path."""
    return "://" in path


def url_fs(url: str):
    """(fsspec file system, path within it) of `url`."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:
        raise DataError(f"cannot open {url} ({err}); install the fsspec backend of that URL scheme") from None


def _info_stamp(info: dict) -> str:
    return f"{info.get('size')}\t{info.get('mtime') or info.get('created') or info.get('LastModified') or ''}"


def file_stamp(path: str) -> str:
    """What changes when the file at `path` (local or URL) is rewritten: size and times (and inode)."""
    if is_url(path):
        fs, inner = url_fs(path)
        return _info_stamp(fs.info(inner))
    st = os.stat(path)
    return f"{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}\t{st.st_ino}"


def _local_caption(stem: str):
    """(caption or None, its file) of the local image whose path without extension is `stem`."""
    for suffix in CAPTION_SUFFIXES:
        path = stem + suffix
        if not os.path.exists(path):
            continue
        if not_regular(path):
            raise DataError(f"{path} is {not_regular(path)}, not a caption file; replace it with a text file")
        size = os.path.getsize(path)
        if size > MAX_CAPTION_BYTES:
            raise too_long(path, size)
        with open(path, "rb") as f:
            raw = f.read(MAX_CAPTION_BYTES + 1)
        return (caption_text(raw, path) if suffix == ".txt" else json_caption(raw, path)), path
    return None, stem + CAPTION_SUFFIXES[0]


def _is_image(name: str) -> bool:
    return not posixpath.basename(name).startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def folder_rows(root: str) -> Iterator[Row]:
    """Every image under folder `root` (sorted by relative path) with the caption file beside it."""
    if is_url(root):
        yield from _url_folder_rows(root)
        return
    found = sorted((os.path.relpath(p, root).replace(os.sep, "/"), p) for p in walk_images(root))
    for rel, path in found:
        stem = os.path.splitext(path)[0]
        caption, where = _local_caption(stem)
        yield os.path.splitext(rel)[0], path, caption, where, file_stamp(path)


def _url_folder_rows(url: str) -> Iterator[Row]:
    fs, root = url_fs(url)
    files = {p: info for p, info in fs.find(root, detail=True).items() if info.get("type") != "directory"}
    for path in sorted(p for p in files if _is_image(p)):
        rel = posixpath.relpath(path, root)
        stem = posixpath.splitext(path)[0]
        caption, where = None, fs.unstrip_protocol(stem + CAPTION_SUFFIXES[0])
        for suffix in CAPTION_SUFFIXES:
            if stem + suffix in files:
                where = fs.unstrip_protocol(stem + suffix)
                size = files[stem + suffix].get("size") or 0
                if size > MAX_CAPTION_BYTES:
                    raise too_long(where, size)
                raw = fs.cat_file(stem + suffix)
                caption = caption_text(raw, where) if suffix == ".txt" else json_caption(raw, where)
                break
        yield posixpath.splitext(rel)[0], fs.unstrip_protocol(path), caption, where, _info_stamp(files[path])


def _lines(manifest: str) -> Iterator[Tuple[int, str]]:
    """(line number, text) of a manifest file, each line held to the limits of a caption row."""
    if is_url(manifest):
        fs, path = url_fs(manifest)
        f = fs.open(path, "rb")
    else:
        if not_regular(manifest):
            raise DataError(f"{manifest} is {not_regular(manifest)}, not a manifest file")
        f = open(manifest, "rb")
    with f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            where = f"{manifest} line {number}"
            if len(raw) > MAX_LINE_BYTES:
                raise DataError(f"{where} runs past {MAX_LINE_BYTES} bytes, longer than any (path, caption) row; "
                                "shorten its caption or remove the row")
            yield number, caption_text(raw, where) if raw.strip() else ""


def _field(row: dict, names, where: str, what: str):
    for name in names:
        if name in row:
            return row[name]
    if what == "path":
        raise DataError(f"{where} has no image path (a field named {' or '.join(names)}); write one per row")
    return None


def _inside(rel, where: str) -> str:
    """The image path `rel` of a manifest row joined to the manifest's folder; refused when it leaves it."""
    if not isinstance(rel, str) or not rel.strip():
        raise DataError(f"{where}: the image path {rel!r} is not a path; write the image's path relative to the "
                        "manifest's folder")
    norm = posixpath.normpath(rel.replace("\\", "/"))
    if is_url(rel) or posixpath.isabs(norm) or norm == ".." or norm.startswith("../") or os.path.isabs(rel):
        raise DataError(f"{where}: the image path {rel!r} leaves the manifest's folder (an absolute path, a URL or "
                        "'..'), which is not followed; write paths relative to the folder that holds the manifest")
    return norm


def _csv_rows(manifest: str, numbered) -> Iterator[Tuple[int, dict]]:
    """(line number, record) of a CSV manifest's lines; a record the csv module cannot read (a quoted field
    past its limit, a stray quote) is a one-line DataError naming its line."""
    records = csv.DictReader(io.StringIO("\n".join(text for _, text in numbered)))

    def line() -> int:  # the file's line number of the reader's last line (blank lines were kept as "")
        return numbered[min(records.line_num, len(numbered)) - 1][0] if numbered else 1

    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except csv.Error as err:
            raise DataError(f"{manifest} line {line()} is not a CSV row ({err}); fix its quoting, shorten its caption "
                            "or remove the row") from None
        yield line(), record


def manifest_rows(manifest: str) -> Iterator[Row]:
    """The rows of a JSONL (an object per line) or CSV (a header naming the columns) manifest of
    (path, caption); images are looked up beside the manifest."""
    base = posixpath.dirname(manifest) if is_url(manifest) else os.path.dirname(os.path.abspath(manifest))
    lines = _lines(manifest)
    if manifest.lower().endswith(".csv"):
        rows = _csv_rows(manifest, list(lines))
    else:
        rows = ((n, _json_row(text, f"{manifest} line {n}")) for n, text in lines if text)
    seen = set()
    for number, row in rows:
        where = f"{manifest} line {number}"
        rel = _inside(_field(row, PATH_FIELDS, where, "path"), where)
        caption = _field(row, CAPTION_FIELDS, where, "caption")
        if caption is not None and not isinstance(caption, str):
            raise DataError(f"{where}: the caption is a {type(caption).__name__}, not text; write it as a string")
        key = posixpath.splitext(rel)[0]
        if key in seen:
            raise DataError(f"{where}: {rel} is listed twice; list each image once")
        seen.add(key)
        if is_url(manifest):
            ref = posixpath.join(base, rel)
            stamp = ""
        else:
            ref = os.path.join(base, *rel.split("/"))
            stamp = file_stamp(ref) if os.path.exists(ref) else "missing"
        yield key, ref, checked(caption, where) if caption is not None else None, where, stamp


def _json_row(text: str, where: str) -> dict:
    try:
        row = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise DataError(f"{where} is not valid JSON ({str(err).splitlines()[0][:80]}); write one object per line") from None
    if not isinstance(row, dict):
        raise DataError(f"{where} is not a JSON object; write one {{\"path\": ..., \"caption\": ...}} per line")
    return row
