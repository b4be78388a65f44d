"""A caption's bytes to its text, refusing what a caption scraped from the internet may be instead:
bytes that are not UTF-8, NUL bytes (binary data, or text meant to cut a string short), megabytes
(no text encoder reads past a few hundred tokens; such a file is data, not a caption)."""

import json
from typing import Optional

from dit_trainer.errors import DataError

# Far above any caption a text encoder reads (T5 at 300 tokens is ~2 KB of English), far below data.
MAX_CAPTION_BYTES = 64 * 1024
JSON_FIELD = "caption"


def too_long(where: str, size: int) -> DataError:
    """The error for a caption of `size` bytes at `where`."""
    return DataError(f"{where}: the caption is {size} bytes, over the {MAX_CAPTION_BYTES} a caption may hold "
                     "(no text encoder reads that far); shorten it or remove the image")


def caption_text(raw: bytes, where: str) -> str:
    """The text of caption bytes, stripped; DataError (naming `where`) for bytes no caption holds."""
    if len(raw) > MAX_CAPTION_BYTES:
        raise too_long(where, len(raw))
    if b"\x00" in raw:
        raise DataError(f"{where}: the caption holds a NUL byte (at byte {raw.index(0)}); it is binary data, not "
                        "text: rewrite it as plain UTF-8 text or remove the image")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{where}: the caption is not UTF-8 text (byte {err.start}); re-save it as UTF-8 or remove "
                        "the image") from None
    return text.removeprefix("\ufeff").strip()  # a byte-order mark is how some editors start UTF-8


def json_caption(raw: bytes, where: str) -> Optional[str]:
    """The `caption` field of a JSON sidecar (img2dataset writes one beside each image); None when it
    has none."""
    text = caption_text(raw, where)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise DataError(f"{where} is not valid JSON ({str(err).splitlines()[0][:80]}); fix it or remove the "
                        "image") from None
    value = data.get(JSON_FIELD) if isinstance(data, dict) else None
    if value is not None and not isinstance(value, str):
        raise DataError(f"{where}: its {JSON_FIELD!r} is a {type(value).__name__}, not text; write the caption as "
                        "a string")
    # JSON escapes (\u0000, a lone \ud800) decode to what the raw bytes could not hold: held to the same rules.
    return checked(value, where) if value is not None else None


def checked(text: str, where: str) -> str:
    """A caption already decoded (a manifest's or a JSON field), held to the same limits as one read from a file."""
    if "\x00" in text:
        raise DataError(f"{where}: the caption holds a NUL character; rewrite it as plain text")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as err:  # a lone surrogate: no UTF-8 text, and no tokenizer, holds one
        raise DataError(f"{where}: the caption holds a lone surrogate (character {err.start}), which is not text; "
                        "rewrite it as plain UTF-8 text") from None
    if size > MAX_CAPTION_BYTES:
        raise too_long(where, size)
    return text.strip()
