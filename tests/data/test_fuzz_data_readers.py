"""Fuzzing the data readers training uses: `.npy` latents, shard manifests and labels files.
Whatever the bytes, the answer is data or a one-line DataError, never a traceback or a hang."""

import io
import json

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.data.test_shards import SHAPE, make_shards

from dit_trainer.data.latents import NpyLatentFolder, read_npy_header
from dit_trainer.data.shards import LatentShards
from dit_trainer.errors import DitError

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def _valid_npy(dtype="float32", shape=SHAPE) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ones(shape, dtype=dtype))
    return buf.getvalue()


def _one_line(fn):
    try:
        return fn()
    except DitError as err:
        assert "\n" not in str(err), str(err)
        return None


npy_bytes = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda n: _valid_npy()[:n], st.integers(0, 400)),  # truncated
    st.builds(lambda d: _valid_npy(d), st.sampled_from(["int8", "float64", "float16", "bool", "complex64"])),
    st.builds(lambda s: _valid_npy(shape=s), st.lists(st.integers(0, 5), max_size=5).map(tuple)),
    # A header that claims a huge array: must not allocate it.
    st.just(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (4000000000, 4, 8, 8), }".ljust(128, b" ")[:127] + b"\n"),
    st.builds(lambda i, b: bytes(bytearray(_valid_npy())[:i] + bytes([b]) + _valid_npy()[i + 1:]),
              st.integers(0, 127), st.integers(0, 255)),  # one header byte changed
)


@FUZZ
@given(data=npy_bytes, nan=st.booleans())
def test_npy_latent_reader(tmp_path_factory, data, nan):
    root = tmp_path_factory.mktemp("npy")
    (root / "0.npy").write_bytes(data)
    if nan:
        arr = np.ones(SHAPE, np.float32)
        arr[0, 0, 0] = np.nan
        np.save(root / "1.npy", arr)
    _one_line(lambda: read_npy_header(str(root / "0.npy")))

    def load():
        ds = NpyLatentFolder(root, num_classes=10)
        for i in range(len(ds)):
            x, y = ds[i]
            assert np.isfinite(x.numpy()).all()

    _one_line(load)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8,
)
MANIFEST_KEYS = ["count", "latent_shape", "dtype", "num_classes", "class_names", "flips", "posterior", "shards", "version"]


@FUZZ
@given(key=st.sampled_from(MANIFEST_KEYS), value=json_values)
def test_shard_manifest_reader(tmp_path_factory, key, value):
    root = tmp_path_factory.mktemp("shards")
    make_shards(root, counts=(3,))
    m = json.loads((root / "manifest.json").read_text())
    m[key] = value
    (root / "manifest.json").write_text(json.dumps(m))

    def load():
        ds = LatentShards(root)
        for i in range(len(ds)):
            ds[i]

    _one_line(load)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200), st.builds(lambda v: json.dumps({"0": v, "1": 1}).encode(), json_values)),
       kind=st.sampled_from(["labels.json", "labels.txt", "labels.npy"]))
@example(raw=b"PK\x03\x04", kind="labels.npy")  # found by this test: numpy opens it as a zip, BadZipFile escaped
def test_labels_readers(tmp_path_factory, raw, kind):
    root = tmp_path_factory.mktemp("labels")
    for i in range(2):
        np.save(root / f"{i}.npy", np.zeros(SHAPE, np.float32))
    (root / kind).write_bytes(raw)
    ds = _one_line(lambda: NpyLatentFolder(root, num_classes=10))
    if ds is not None:
        assert all(0 <= int(ds[i][1]) < 10 for i in range(len(ds)))


@FUZZ
@given(labels=st.lists(st.one_of(st.integers(-5, 20), st.floats(-5, 20)), min_size=3, max_size=3))
def test_shard_labels_reader(tmp_path_factory, labels):
    root = tmp_path_factory.mktemp("shard_labels")
    make_shards(root, counts=(3,))
    np.save(root / "shard-00000.labels.npy", np.array(labels))
    ds = _one_line(lambda: LatentShards(root))
    if ds is not None:
        assert all(0 <= int(ds[i][1]) < 3 for i in range(len(ds)))
