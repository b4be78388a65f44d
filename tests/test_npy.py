"""The `.npy` reader: numpy's arrays back bit for bit, without `ast`, other spellings through numpy."""

import ast
import io
import struct

import numpy as np
import pytest

from dit_trainer.npy import read_array, read_header

ARRAYS = [
    np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32),
    np.random.default_rng(1).standard_normal((4, 8, 8)).astype(np.float16),
    np.arange(5, dtype=">f8"),
    np.asfortranarray(np.random.default_rng(2).standard_normal((3, 4, 5))),
    np.array(7, dtype=np.int64),
    np.zeros((0, 3), dtype=np.float32),
]


def _saved(arr, version=None) -> io.BytesIO:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr)
    else:
        np.lib.format.write_array(buf, arr, version=version)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
@pytest.mark.parametrize("version", [None, (2, 0)])
def test_reads_what_numpy_writes_without_ast(arr, version, monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the reader parsed a header with ast")

    monkeypatch.setattr(ast, "literal_eval", refuse)
    monkeypatch.setattr(ast, "parse", refuse)
    got = read_array(_saved(arr, version))
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert got.tobytes(order="A") == arr.tobytes(order="A") and np.array_equal(got, arr)
    assert got.flags.writeable


def test_header_leaves_the_file_at_the_data():
    arr = ARRAYS[0]
    buf = _saved(arr)
    shape, fortran, dtype = read_header(buf)
    assert (shape, fortran, dtype) == (arr.shape, False, arr.dtype)
    assert len(buf.read()) == arr.nbytes


def test_another_writers_spelling_goes_through_numpy():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    header = b"{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}"
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    raw = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + arr.tobytes()
    assert np.array_equal(read_array(io.BytesIO(raw)), arr)


@pytest.mark.parametrize("cut", [0, 5, 9, 40, -1])
def test_short_or_foreign_files_raise_value_or_eof_errors(cut):
    raw = _saved(ARRAYS[0]).getvalue()
    with pytest.raises((ValueError, EOFError)):
        read_array(io.BytesIO(raw[:cut]))
    with pytest.raises(ValueError, match="magic"):
        read_array(io.BytesIO(b"PK\x03\x04" + raw))


def test_object_arrays_are_refused_not_unpickled():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    buf.seek(0)
    with pytest.raises(ValueError, match="never unpickled"):
        read_array(buf)
