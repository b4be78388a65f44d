"""Fuzzing the checkpoint readers: weights-only `.pt`, safetensors, DCP `.metadata` and the
checksum manifest. Truncated, flipped or random bytes give a one-line CheckpointError (or the data)."""

import io
import json
import pickle

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.checkpoint.safe_dcp import read_metadata_file
from dit_trainer.errors import CheckpointError

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def _pt() -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(3, 2), "step": 3}, buf)
    return buf.getvalue()


def _metadata() -> bytes:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                       TensorProperties, TensorStorageMetadata)

    prop = TensorProperties(dtype=torch.float32)
    md = Metadata({"w": TensorStorageMetadata(prop, torch.Size([2]), [ChunkStorageMetadata(torch.Size([0]), torch.Size([2]))])},
                  storage_data={MetadataIndex("w", torch.Size([0])): _StorageInfo("__0_0.distcp", 0, 10)})
    return pickle.dumps(md)


VALID = {"pt": _pt(), "safetensors": save({"w": torch.ones(3, 2)}), "metadata": _metadata()}


def mangled(valid: bytes):
    return st.one_of(
        st.binary(max_size=300),
        st.builds(lambda n: valid[:n], st.integers(0, len(valid))),
        st.builds(lambda i, b: valid[:i] + bytes([b]) + valid[i + 1:], st.integers(0, len(valid) - 1), st.integers(0, 255)),
    )


@settings(FUZZ)
@given(kind=st.sampled_from(sorted(VALID)), data=st.data())
def test_checkpoint_file_readers(tmp_path_factory, kind, data):
    raw = data.draw(mangled(VALID[kind]))
    path = tmp_path_factory.mktemp("ck") / f"x.{kind}"
    path.write_bytes(raw)
    read = {"pt": ckpt.load_pt, "safetensors": ckpt.load_safetensors, "metadata": read_metadata_file}[kind]
    try:
        read(path)
    except CheckpointError as err:
        assert "\n" not in str(err)


@settings(FUZZ)
@given(manifest=st.one_of(st.binary(max_size=100).map(lambda b: b.decode("latin-1")),
                          st.builds(lambda size, digest, name: json.dumps({"files": {name: {"size": size, "sha256": digest}}}),
                                    st.integers(-2, 10**12), st.text(max_size=64), st.sampled_from(["model.safetensors", "../x", "", "nope"]))))
def test_manifest_verifier(tmp_path_factory, manifest):
    folder = tmp_path_factory.mktemp("step")
    (folder / "model.safetensors").write_bytes(VALID["safetensors"])
    (folder / ckpt.MANIFEST).write_text(manifest)
    try:
        ckpt.verify_checkpoint(folder)
    except CheckpointError as err:
        assert "\n" not in str(err)


def test_a_pickle_error_of_several_lines_stays_one_line(tmp_path):
    # The fuzzer's find: pickle's message for a persistent-id opcode spans two lines.
    from dit_trainer.convert.pdparams import load_pdparams

    path = tmp_path / "x.metadata"
    path.write_bytes(b"Pabc\n.")
    for read in (read_metadata_file, load_pdparams):
        try:
            read(path)
        except CheckpointError as err:
            assert "refused" in str(err) and "\n" not in str(err), read.__name__
        else:
            raise AssertionError(f"{read.__name__} accepted a persistent-id pickle")


def test_metadata_with_any_byte_zeroed_or_set_is_refused_in_one_line(tmp_path):
    # Found by the fuzzer above: byte 572 zeroed left a _StorageInfo without `relative_path`, and the
    # reader raised AttributeError instead of a CheckpointError. Every position, both extremes.
    valid = VALID["metadata"]
    path = tmp_path / "x.metadata"
    for i in range(len(valid)):
        for b in (0, 255):
            # A new file each time: ext4 flushes a file truncated and rewritten in place to disk on close (its
            # auto_da_alloc), which made the ~1,300 rewrites wait on the disk for seconds.
            path.unlink(missing_ok=True)
            path.write_bytes(valid[:i] + bytes([b]) + valid[i + 1:])
            try:
                read_metadata_file(path)
            except CheckpointError as err:
                assert "\n" not in str(err)
