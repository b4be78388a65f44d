"""Reading `.npy` arrays (latents, labels, sample batches) without numpy's header parser.

numpy reads a `.npy` header with `ast.literal_eval`. On CPython 3.11.5–3.11.7 the AST constructor
keeps its recursion counter in interpreter-wide state, so a parse that another thread interleaves
with (a thread switch during a garbage collection is enough) fails with "SystemError: AST
constructor recursion depth mismatch" (python/cpython#106905). Latents are read in a thread pool and
in DataLoader workers, so that rare error would stop a training run; data/ and evaluate/ both read
their headers here. The header numpy writes is one fixed dict spelling, read here with a regular
expression; any other spelling goes to numpy.
"""

import re
import struct
from typing import BinaryIO, Tuple

import numpy as np

MAGIC = b"\x93NUMPY"
_HEADER = re.compile(r"\{'descr': '([^']+)', 'fortran_order': (True|False), 'shape': \(([0-9, ]*)\), \}\s*$")
_LENGTH = {1: "<H", 2: "<I"}  # version 3 only exists for non-Latin-1 field names: never a latent


def read_header(f: BinaryIO) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype of the `.npy` file `f`, leaving `f` at its data; ValueError or
    EOFError if it is not one."""
    start = f.tell()
    lead = f.read(8)
    if len(lead) < 8 or lead[:6] != MAGIC:
        raise ValueError("the file does not start with the .npy magic bytes")
    fmt = _LENGTH.get(lead[6])
    if fmt is None:
        raise ValueError(f"unsupported .npy version {lead[6]}.{lead[7]}")
    size = f.read(struct.calcsize(fmt))
    if len(size) < struct.calcsize(fmt):
        raise EOFError("the .npy header is cut short")
    (length,) = struct.unpack(fmt, size)
    raw = f.read(length)
    if len(raw) < length:
        raise EOFError("the .npy header is cut short")
    match = _HEADER.match(raw.decode("latin1"))
    if match is None:
        f.seek(start + 8)
        read = np.lib.format.read_array_header_1_0 if lead[6] == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        return tuple(int(s) for s in shape), bool(fortran), dtype
    descr, fortran, dims = match.groups()
    shape = tuple(int(d) for d in dims.split(",") if d.strip())
    return shape, fortran == "True", np.dtype(descr)


def read_array(f: BinaryIO) -> np.ndarray:
    """The array of the `.npy` file `f` as a writable C-or-Fortran array; object arrays are refused,
    never unpickled."""
    shape, fortran, dtype = read_header(f)
    if dtype.hasobject:
        raise ValueError(f"the array holds Python objects ({dtype}), which are never unpickled")
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.empty(count, dtype=dtype)
    got = f.readinto(flat.view(np.uint8)) if count else 0
    if got < flat.nbytes:
        raise EOFError(f"the data ends {flat.nbytes - got} bytes short of {shape} {dtype}")
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
