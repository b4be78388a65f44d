"""Reading `.npy` arrays (latents, labels, shards, sample batches) without numpy's header parser.

numpy reads a `.npy` header with `ast.literal_eval`. On CPython 3.11.5–3.11.7 the AST constructor
keeps its recursion counter in interpreter-wide state, so a parse that another thread interleaves
with (a thread switch during a garbage collection is enough) fails with "SystemError: AST
constructor recursion depth mismatch" (python/cpython#106905). Latents are read in a thread pool and
in DataLoader workers, so that rare error would stop a training run; data/ and evaluate/ read their
headers here. The header is a Python dict literal; it is read by a small parser of the literals a
header can hold (strings, integers, True/False/None, tuples, lists, dicts), never by `ast` or
`tokenize`, whatever its spelling.

Whatever the bytes, a file that is not an array numpy could have written raises NpyError, a
ValueError whose message is one line: an unknown dtype, a negative or non-integer dimension, a
header cut short, a shape whose size overflows, data bytes that do not match the header. The data
length is checked against the file before anything is allocated for it.
"""

import os
import re
import stat
import struct
import sys
from typing import BinaryIO, Optional, Tuple

import numpy as np

MAGIC = b"\x93NUMPY"
_LENGTH = {1: "<H", 2: "<I", 3: "<I"}
_ENCODING = {1: "latin1", 2: "latin1", 3: "utf8"}
MAX_HEADER = 1 << 20  # numpy's own writer stays far below; a larger length is damage, not a header
_MAX_DEPTH = 32  # nesting of a structured dtype's descr; deeper is damage (and would recurse)
_CHUNK = 16 << 20  # reads from a stream whose length is unknown


class NpyError(ValueError):
    """A file that is not a `.npy` array numpy could have written; the message is one line."""


_SPACE = re.compile(r"[ \t\r\n\f\v]*")
_NUMBER = re.compile(r"[-+]?[0-9][0-9A-Za-z_.]*(?:(?<=[eE])[-+][0-9]+)?")
_INTEGER = re.compile(r"[-+]?[0-9]+L?")  # Python 2's numpy wrote long dimensions as 3L
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAMES = {"True": True, "False": False, "None": None}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_CUT = "the header ends before its dict closes"


def _show(text: str) -> str:
    return repr(text if len(text) <= 24 else text[:24] + "...")


class _Literal:
    """A reader of the Python literals a `.npy` header holds, one position at a time."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def peek(self) -> str:
        """The next character after whitespace ('' at the end)."""
        self.pos = _SPACE.match(self.text, self.pos).end()
        return self.text[self.pos:self.pos + 1]

    def value(self, depth: int = 0):
        """The literal at the current position."""
        if depth > _MAX_DEPTH:
            raise NpyError(f"the header nests deeper than {_MAX_DEPTH} levels")
        c = self.peek()
        if c == "":
            raise NpyError(_CUT)
        if c in "'\"":
            return self.string(c)
        if c in "{([":
            self.pos += 1
            return self.dict(depth) if c == "{" else self.sequence({"(": ")", "[": "]"}[c], depth)
        match = _NUMBER.match(self.text, self.pos) or _NAME.match(self.text, self.pos)
        if match is None:
            raise NpyError(f"unexpected {_show(self.text[self.pos:])} in the header")
        self.pos, token = match.end(), match.group()
        if token in _NAMES:
            return _NAMES[token]
        if _INTEGER.fullmatch(token):
            try:
                return int(token.rstrip("L"))
            except ValueError:  # more digits than int() takes
                raise NpyError(f"the number {_show(token)} in the header is too long") from None
        try:
            return float(token)
        except ValueError:
            raise NpyError(f"{_show(token)} in the header is not a literal") from None

    def string(self, quote: str) -> str:
        """A quoted string with Python's escapes."""
        out, i, text = [], self.pos + 1, self.text
        while True:
            if i >= len(text) or text[i] == "\n":
                raise NpyError(_CUT if i >= len(text) else "a string in the header is not closed")
            c = text[i]
            if c == quote:
                self.pos = i + 1
                return "".join(out)
            if c != "\\":
                out.append(c)
                i += 1
                continue
            e = text[i + 1:i + 2]
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                i += 2
            elif e in _HEX_ESCAPES:
                digits = text[i + 2:i + 2 + _HEX_ESCAPES[e]]
                if len(digits) != _HEX_ESCAPES[e] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                    raise NpyError(f"a bad \\{e} escape in a header string")
                code = int(digits, 16)
                if code > sys.maxunicode:
                    raise NpyError(f"a bad \\{e} escape in a header string")
                out.append(chr(code))
                i += 2 + len(digits)
            else:
                raise NpyError(f"an escape the header reader does not take ({_show(text[i:i + 2])})")

    def sequence(self, close: str, depth: int):
        """The items up to `close`: a list, a tuple, or a parenthesised value."""
        items, comma = [], False
        while True:
            c = self.peek()
            if c == close:
                self.pos += 1
                if close == ")" and len(items) == 1 and not comma:
                    return items[0]  # (x) is x, as in Python
                return tuple(items) if close == ")" else items
            if c == "":
                raise NpyError(_CUT)
            if items and not comma:
                raise NpyError(f"expected ',' or {close!r} in the header, found {_show(self.text[self.pos:])}")
            items.append(self.value(depth + 1))
            comma = self.peek() == ","
            if comma:
                self.pos += 1

    def dict(self, depth: int) -> dict:
        """The key: value pairs up to '}'."""
        out, comma = {}, False
        while True:
            c = self.peek()
            if c == "}":
                self.pos += 1
                return out
            if c == "":
                raise NpyError(_CUT)
            if out and not comma:
                raise NpyError(f"expected ',' or '}}' in the header, found {_show(self.text[self.pos:])}")
            key = self.value(depth + 1)
            if not isinstance(key, str):
                raise NpyError(f"the header has a key {key!r} that is not a string")
            if self.peek() != ":":
                raise NpyError(_CUT if self.peek() == "" else f"expected ':' after {key!r} in the header")
            self.pos += 1
            out[key] = self.value(depth + 1)
            comma = self.peek() == ","
            if comma:
                self.pos += 1


def parse_header(text: str) -> dict:
    """The header dict of a `.npy` file from its text; NpyError if it is not one."""
    reader = _Literal(text)
    if reader.peek() != "{":
        raise NpyError("the header is not a dict" if reader.peek() else "the header is empty")
    header = reader.value()
    if reader.peek():
        raise NpyError(f"the header has {_show(reader.text[reader.pos:])} after its dict")
    return header


def _dtype(descr) -> np.dtype:
    try:
        if isinstance(descr, str):
            return np.dtype(descr)
        if isinstance(descr, list):
            return np.lib.format.descr_to_dtype(descr)
    except Exception:  # numpy's TypeError, ValueError, KeyError, ... for a descr it does not know
        pass
    raise NpyError(f"unknown dtype descr {_show(str(descr))}")


def header_fields(header: dict) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of a parsed header; NpyError if any is not what numpy writes."""
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        keys = sorted(header) if isinstance(header, dict) else header
        raise NpyError(f"the header holds {_show(str(keys))}, not exactly descr, fortran_order and shape")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple):
        raise NpyError(f"shape {_show(str(shape))} is not a tuple")
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int):
            raise NpyError(f"shape {_show(str(shape))} has a dimension that is not an integer")
        if d < 0:
            raise NpyError(f"shape {_show(str(shape))} has a negative dimension")
    if not isinstance(fortran, bool):
        raise NpyError(f"fortran_order is {_show(str(fortran))}, not True or False")
    return shape, fortran, _dtype(header["descr"])


def data_bytes(shape: Tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of the data of a `shape` array of `dtype`; NpyError when no array could be that large."""
    count = 1
    for d in shape:
        count *= d
    nbytes = count * dtype.itemsize
    if count > sys.maxsize or nbytes > sys.maxsize:
        raise NpyError(f"shape {_show(str(shape))} of {dtype} is larger than any array ({nbytes} bytes)")
    return nbytes


def check_data_length(shape: Tuple[int, ...], dtype: np.dtype, available: int) -> int:
    """The data's byte count; NpyError unless exactly `available` bytes follow the header."""
    if dtype.hasobject:
        raise NpyError(f"the array holds Python objects ({dtype}), which are never unpickled")
    need = data_bytes(shape, dtype)
    if available < need:
        raise NpyError(f"truncated: {available} of the {need} data bytes of shape {shape} {dtype}")
    if available > need:
        raise NpyError(f"{available - need} bytes follow the {need} data bytes of shape {shape} {dtype}")
    return need


def read_header(f: BinaryIO) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype of the `.npy` file `f`, leaving `f` at its data; NpyError if it
    is not one."""
    lead = f.read(8)
    if len(lead) < 8 or lead[:6] != MAGIC:
        raise NpyError("the file does not start with the .npy magic bytes")
    fmt = _LENGTH.get(lead[6])
    if fmt is None or lead[7] != 0:
        raise NpyError(f"unsupported .npy version {lead[6]}.{lead[7]}")
    size = f.read(struct.calcsize(fmt))
    if len(size) < struct.calcsize(fmt):
        raise NpyError("the file ends inside the .npy header")
    (length,) = struct.unpack(fmt, size)
    if length > MAX_HEADER:
        raise NpyError(f"the header claims {length} bytes, more than the {MAX_HEADER} a .npy header takes")
    raw = f.read(length)
    if len(raw) < length:
        raise NpyError(f"the file ends inside the .npy header ({len(raw)} of its {length} bytes)")
    try:
        text = raw.decode(_ENCODING[lead[6]])
    except UnicodeDecodeError:
        raise NpyError("the header is not valid UTF-8") from None
    return header_fields(parse_header(text))


def _bytes_after(f: BinaryIO) -> Optional[int]:
    """Bytes from the position of `f` to its end, when that can be known without reading them."""
    try:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode):
            return st.st_size - f.tell()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        pass
    try:
        if f.seekable():
            here = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(here)
            return end - here
    except (AttributeError, OSError, ValueError):
        pass
    return None


def _read_stream(f: BinaryIO, shape, dtype: np.dtype, need: int) -> bytearray:
    # A pipe or stream: read in chunks, so a header that lies about its size allocates what is there only.
    data = bytearray()
    while len(data) < need:
        chunk = f.read(min(_CHUNK, need - len(data)))
        if not chunk:
            raise NpyError(f"truncated: {len(data)} of the {need} data bytes of shape {shape} {dtype}")
        data += chunk
    if f.read(1):
        raise NpyError(f"more bytes follow the {need} data bytes of shape {shape} {dtype}")
    return data


def read_array(f: BinaryIO, size: Optional[int] = None) -> np.ndarray:
    """The array of the `.npy` file `f` (of `size` bytes in all where the caller knows it, as for a zip
    member) as a writable C-or-Fortran array; object arrays are refused, never unpickled."""
    start = f.tell() if size is not None else 0
    shape, fortran, dtype = read_header(f)
    if dtype.hasobject:
        raise NpyError(f"the array holds Python objects ({dtype}), which are never unpickled")
    need = data_bytes(shape, dtype)
    count = int(np.prod(shape, dtype=object)) if shape else 1  # <= sys.maxsize: data_bytes checked it
    after = size - (f.tell() - start) if size is not None else _bytes_after(f)
    if after is None:
        data = _read_stream(f, shape, dtype, need)
        flat = np.frombuffer(data, dtype=dtype) if need else np.empty(count, dtype)
    else:
        check_data_length(shape, dtype, after)
        flat = np.empty(count, dtype)
        view, got = memoryview(flat.view(np.uint8)) if need else None, 0
        while got < need:
            n = f.readinto(view[got:])
            if not n:
                raise NpyError(f"truncated: {got} of the {need} data bytes of shape {shape} {dtype}")
            got += n
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


def open_memmap(path) -> np.ndarray:
    """The array of the `.npy` file at `path`, memory-mapped read-only once its header and length
    check (what `np.load(path, mmap_mode="r")` gives, without numpy's header parser)."""
    with open(path, "rb") as f:
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
        size = os.fstat(f.fileno()).st_size
    check_data_length(shape, dtype, size - offset)
    if data_bytes(shape, dtype) == 0:  # mmap cannot map nothing
        empty = np.empty(shape, dtype, order="F" if fortran else "C")
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
