"""Image batches in .npz files (`arr_0`, uint8 N×H×W×3, the ADM evaluator's format), read in batches.

A 50,000-image batch at 256 px is 9.8 GB, so `arr_0` is streamed from the zip member instead of
loaded whole (ADM's evaluator does the same).
"""

import contextlib
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from dit_trainer.errors import DataError, one_line
from dit_trainer.fs import check_regular
from dit_trainer.npy import NpyError, check_data_length, read_array, read_header

IMAGES_KEY = "arr_0"


def npz_keys(path) -> list:
    """Names of the arrays in an .npz file."""
    path = Path(path)
    check_regular(path, DataError, "an .npz")
    if not path.is_file():
        raise DataError(f"{path} not found")
    try:
        with zipfile.ZipFile(path) as z:
            return [n[:-4] for n in z.namelist() if n.endswith(".npy")]
    except zipfile.BadZipFile:
        raise DataError(f"{path} is not an .npz file (np.savez writes one)") from None


class NpzImages:
    """`arr_0` of an .npz file as uint8 N×H×W×3 batches; 1-channel and N×H×W images are repeated to RGB."""

    def __init__(self, path):
        self.path = Path(os.fspath(path))
        if IMAGES_KEY not in npz_keys(self.path):
            raise DataError(f"{self.path} has no '{IMAGES_KEY}' array; expected uint8 N×H×W×3 images in arr_0")
        with self._open() as (f, member_size):
            shape, fortran, dtype = _read_header(f, self.path)
            data_start = f.tell()
        if dtype != np.uint8 or fortran or len(shape) not in (3, 4) or (len(shape) == 4 and shape[3] not in (1, 3)):
            raise DataError(
                f"{self.path}: {IMAGES_KEY} is {dtype} {'Fortran-order ' if fortran else ''}{shape}; "
                f"expected uint8 N×H×W×3 (or N×H×W×1)"
            )
        # Against the member's size in the zip directory: a header that promises more (or fewer)
        # images than are stored fails here, before a batch is read or allocated.
        try:
            check_data_length(shape, dtype, member_size - data_start)
        except NpyError as err:
            raise DataError(f"{self.path}: {IMAGES_KEY} does not match its header ({err}); re-save it with "
                            f"np.savez") from None
        self.shape = tuple(shape)

    @contextlib.contextmanager
    def _open(self):
        """(arr_0's stream, its size); a damaged zip member is a DataError naming the file."""
        try:
            with zipfile.ZipFile(self.path) as z:
                info = z.getinfo(IMAGES_KEY + ".npy")
                with z.open(info) as f:
                    yield f, info.file_size
        except (zipfile.BadZipFile, zlib.error, EOFError) as err:
            raise DataError(f"{self.path}: {IMAGES_KEY} cannot be read ({type(err).__name__}: {one_line(err)}); "
                            f"re-save it with np.savez") from None

    def __len__(self) -> int:
        return self.shape[0]

    def batches(self, batch_size: int):
        """Yield uint8 b×H×W×3 arrays in file order."""
        per_image = int(np.prod(self.shape[1:]))
        with self._open() as (f, _):
            _read_header(f, self.path)
            for start in range(0, len(self), batch_size):
                n = min(batch_size, len(self) - start)
                data = f.read(n * per_image)
                if len(data) != n * per_image:
                    raise DataError(f"{self.path}: {IMAGES_KEY} is truncated at image {start}")
                # bytearray: a writable buffer, which torch.as_tensor wants.
                yield to_rgb_batch(np.frombuffer(bytearray(data), np.uint8).reshape((n,) + self.shape[1:]))


def _read_header(f, path):
    try:
        return read_header(f)
    except NpyError as err:
        raise DataError(f"{path}: {IMAGES_KEY} is not an array numpy.save writes ({err}); "
                        f"re-save it with np.savez") from None


def read_npz_array(path, key: str, remedy: str) -> np.ndarray:
    """Array `key` of the .npz at `path`, read without numpy's header parser; DataError (one line
    naming the file, the array and `remedy`) for a damaged member."""
    try:
        with zipfile.ZipFile(path) as z:
            info = z.getinfo(key + ".npy")
            with z.open(info) as f:
                return read_array(f, size=info.file_size)
    except NpyError as err:
        raise DataError(f"{path}: {key} is not an array numpy.save writes ({err}); {remedy}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError) as err:
        raise DataError(f"{path}: {key} cannot be read ({type(err).__name__}: {one_line(err)}); {remedy}") from None


def to_rgb_batch(images: np.ndarray) -> np.ndarray:
    """uint8 N×H×W, N×H×W×1 or N×H×W×3 as N×H×W×3."""
    if images.ndim == 3:
        images = images[..., None]
    return np.repeat(images, 3, axis=3) if images.shape[3] == 1 else images
