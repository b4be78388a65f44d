"""The `.npy` reader: numpy's arrays back bit for bit, any header spelling read without `ast`, and every
malformed file an NpyError whose message is one line, raised before the data is allocated."""

import ast
import io
import re
import struct
import tokenize
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dit_trainer import npy
from dit_trainer.npy import NpyError, open_memmap, parse_header, read_array, read_header

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

    with monkeypatch.context() as m:
        m.setattr(ast, "literal_eval", refuse)
        m.setattr(ast, "parse", refuse)
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


def npy_bytes(header: str, data: bytes = b"", version: int = 1) -> bytes:
    """A .npy file of this header text and data, padded as numpy pads it."""
    fmt = "<H" if version == 1 else "<I"
    raw = header.encode("utf8" if version == 3 else "latin1")
    raw += b" " * (-(6 + 2 + struct.calcsize(fmt) + len(raw) + 1) % 64) + b"\n"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack(fmt, len(raw)) + raw + data


def malformed(arr: np.ndarray) -> dict:
    """Every kind of damaged header or length, as .npy bytes built from `arr` (C order)."""
    descr, shape, data = np.lib.format.dtype_to_descr(arr.dtype), arr.shape, arr.tobytes()

    def header(descr=repr(descr), fortran="False", shape=repr(shape), close="}"):
        return f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, {close}"

    bad_shape = (-1,) + shape[1:]
    good = npy_bytes(header(), data)
    return {
        "unknown-descr": npy_bytes(header(descr="'zz9'"), data),
        "negative-dimension": npy_bytes(header(shape=repr(bad_shape)), data),
        "non-integer-dimension": npy_bytes(header(shape=repr((2.5,) + shape[1:])), data),
        "string-dimension": npy_bytes(header(shape=repr(("4",) + shape[1:])), data),
        "cut-before-brace": npy_bytes(header(close=""), data),
        "cut-inside-a-string": npy_bytes("{'descr': '<f4", data),
        "file-ends-in-header": good[:40],
        "data-short": good[:-8],
        "data-long": good + bytes(16),
        "size-overflows": npy_bytes(header(shape=repr((2**40, 2**40, 2**40))), data),
        "size-huge": npy_bytes(header(shape=repr((4_000_000_000,) + shape[1:])), data),
        "fortran-not-bool": npy_bytes(header(fortran="'no'"), data),
        "keys": npy_bytes(f"{{'descr': {descr!r}, 'shape': {shape!r}}}", data),
        "not-a-dict": npy_bytes("[1, 2, 3]", data),
        "header-length-huge": b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**31) + b"{",
        "deep-nesting": npy_bytes("{'descr': " + "[" * 200 + "]" * 200 + "}", data),
    }


CASES = malformed(np.arange(24, dtype=np.float32).reshape(2, 3, 4))


@pytest.mark.filterwarnings("ignore:Stored array in format 3.0")
def test_any_spelling_of_a_header_is_read_without_ast(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the reader parsed a header with ast or tokenize")

    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    headers = ["{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
               '{"descr":"<f4","fortran_order":False,"shape":(2,3,)}',
               "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }",  # Python 2's numpy
               "{ 'descr' : '\\x3cf4' ,\t'fortran_order' : False , 'shape' : ( 2 , 3 ) }"]
    structured = np.zeros(3, dtype=[("a", "<f4"), ("b", "<i8", (2,)), ("λ", "<u2")])
    buf = io.BytesIO()
    np.save(buf, structured)  # a field name beyond Latin-1 makes it a version 3.0 file
    with monkeypatch.context() as m:  # only around the reads: pytest's own reports parse with ast
        for name in ("literal_eval", "parse"):
            m.setattr(ast, name, refuse)
        m.setattr(tokenize, "generate_tokens", refuse)
        got = [read_array(io.BytesIO(npy_bytes(h, arr.tobytes()))) for h in headers]
        got_structured = read_array(io.BytesIO(buf.getvalue()))
    assert all(np.array_equal(g, arr) for g in got)
    assert buf.getvalue()[6] == 3 and got_structured.dtype == structured.dtype


header_text = st.fixed_dictionaries({
    "descr": st.sampled_from(["<f4", "|u1", ">i8", "<U3", "|b1", "<c16"]),
    "fortran_order": st.booleans(),
    "shape": st.lists(st.integers(0, 2**40), max_size=4).map(tuple),
}).flatmap(lambda d: st.tuples(st.just(d), st.permutations(list(d)), st.sampled_from(["", " ", "  \t"]),
                                st.sampled_from(["'", '"']), st.booleans()))


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(header_text)
def test_the_parser_reads_what_python_reads(case):
    d, order, space, quote, trailing_comma = case

    def lit(v):
        return f"{quote}{v}{quote}" if isinstance(v, str) else repr(v)

    text = "{" + f",{space}".join(f"{lit(k)}:{space}{lit(d[k])}" for k in order) + ("," if trailing_comma else "") + "}"
    assert parse_header(text) == ast.literal_eval(text) == d


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(alphabet="{}()[]'\",: -.0123456789eLTrueFalsNonx\\<f4", max_size=60))
def test_any_text_parses_as_python_would_or_is_one_line_npy_error(text):
    try:
        got = parse_header(text)
    except NpyError as err:
        assert "\n" not in str(err)
        return
    try:
        want = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        # Python 2's 3L and leading zeros are read as numbers; nothing else Python refuses is.
        assert re.search(r"[0-9]L|(?<![0-9.])0[0-9]", text), text
        return
    assert got == want


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("source", ["bytes", "file", "stream", "zip", "memmap"])
def test_every_malformed_file_is_one_line_npy_error_before_any_allocation(name, source, tmp_path, monkeypatch):
    data = CASES[name]
    path = tmp_path / "bad.npy"
    path.write_bytes(data)
    real_empty = np.empty

    def small_empty(shape, *a, **k):
        assert np.prod(shape, dtype=object) < 10**6, f"allocated {shape} for a malformed file"
        return real_empty(shape, *a, **k)

    monkeypatch.setattr(np, "empty", small_empty)
    with pytest.raises(NpyError) as err:
        if source == "bytes":
            read_array(io.BytesIO(data))
        elif source == "file":
            with open(path, "rb") as f:
                read_array(f)
        elif source == "stream":  # no fileno, no seek: the length cannot be asked in advance
            read_array(io.BufferedReader(_Unseekable(data)))
        elif source == "zip":
            with zipfile.ZipFile(tmp_path / "a.npz", "w") as z:
                z.writestr("arr_0.npy", data)
            with zipfile.ZipFile(tmp_path / "a.npz") as z, z.open("arr_0.npy") as f:
                read_array(f, size=z.getinfo("arr_0.npy").file_size)
        else:
            open_memmap(path)
    assert "\n" not in str(err.value) and str(err.value)


class _Unseekable(io.RawIOBase):
    def __init__(self, data):
        self.stream = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, b):
        return self.stream.readinto(b)


def _header_parsers_used(tree) -> list:
    """Calls and imports in a module that would parse a .npy header with numpy's ast-based reader."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [n for n in names if n in ("ast", "tokenize")]
        elif isinstance(node, ast.Attribute):
            if node.attr in ("literal_eval", "safe_eval", "read_array_header_1_0", "read_array_header_2_0",
                             "_read_array_header", "descr_to_dtype_eval"):
                found.append(node.attr)
            if node.attr == "load" and isinstance(node.value, ast.Name) and node.value.id in ("np", "numpy"):
                found.append("np.load")
            if node.attr in ("read_array", "open_memmap") and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "format":
                found.append(f"np.lib.format.{node.attr}")
    return found


def test_the_readers_call_no_numpy_or_ast_header_parser():
    src = Path(npy.__file__).parent
    files = [src / "npy.py", *(src / "data").rglob("*.py"), *(src / "evaluate").rglob("*.py")]
    used = {str(p.relative_to(src)): _header_parsers_used(ast.parse(p.read_text())) for p in files}
    assert {p: u for p, u in used.items() if u} == {}
    assert _header_parsers_used(ast.parse("import numpy as np\nnp.load('a.npy')")) == ["np.load"]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_memmap_is_what_np_load_maps(arr, tmp_path):
    np.save(tmp_path / "a.npy", arr)
    got, want = open_memmap(tmp_path / "a.npy"), np.load(tmp_path / "a.npy", mmap_mode="r")
    assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
    assert not got.flags.writeable and got.flags.f_contiguous == want.flags.f_contiguous


@pytest.mark.parametrize("cut", [0, 5, 9, 40, -1])
def test_short_or_foreign_files_raise_npy_errors(cut):
    raw = _saved(ARRAYS[0]).getvalue()
    with pytest.raises(NpyError):
        read_array(io.BytesIO(raw[:cut]))
    with pytest.raises(NpyError, match="magic"):
        read_array(io.BytesIO(b"PK\x03\x04" + raw))


def test_object_arrays_are_refused_not_unpickled():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    buf.seek(0)
    with pytest.raises(ValueError, match="never unpickled"):
        read_array(buf)
