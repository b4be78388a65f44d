"""checkpoint.files.save_checkpoint, the one write path of full and sharded checkpoints: every rank's
shards and rank 0's files land in one temporary folder that the manifest signs before the rename,
and a failure on any rank is an error on every rank that leaves no folder behind."""

import errno
import json

import pytest
import torch

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.errors import CheckpointError


def _files():
    return {"ema.safetensors": {"w": torch.ones(2)}, "config.yaml": "model: {}\n"}


def _left(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir()) if (out / "checkpoints").is_dir() else []


def test_shards_and_files_share_one_signed_folder(tmp_path):
    calls = []

    def shards(folder):
        assert folder.name == "step-00000003.tmp" and not (folder / "config.yaml").exists()  # shards come first
        (folder / "dcp").mkdir()
        (folder / "dcp" / "__0_0.distcp").write_bytes(b"shard")

    writers = ckpt.Writers(True, lambda flag: calls.append(flag) or flag, lambda: calls.append("barrier"))
    final = ckpt.save_checkpoint(tmp_path, 3, _files(), shards=shards, writers=writers)
    assert final == tmp_path / "checkpoints" / "step-00000003" and _left(tmp_path) == ["step-00000003"]
    signed = json.loads((final / "manifest.json").read_text())["files"]
    assert sorted(signed) == ["config.yaml", "dcp/__0_0.distcp", "ema.safetensors"]
    ckpt.verify_checkpoint(final)
    assert calls == [False, False, "barrier"]  # the ranks agreed after begin and after the write


def test_another_ranks_failure_fails_every_rank_and_leaves_nothing(tmp_path):
    answers = iter([False, True])  # the folder was made; then some other rank could not write its shards
    writers = ckpt.Writers(True, lambda flag: next(answers), lambda: None)
    with pytest.raises(CheckpointError, match="another rank failed to write its shards"):
        ckpt.save_checkpoint(tmp_path, 1, _files(), shards=lambda folder: None, writers=writers)
    assert _left(tmp_path) == []


def test_a_failed_shard_write_is_one_line_on_that_rank(tmp_path):
    def shards(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    writers = ckpt.Writers(False, lambda flag: flag, lambda: None)  # not rank 0: it creates and signs nothing
    with pytest.raises(CheckpointError) as err:
        ckpt.save_checkpoint(tmp_path, 1, _files(), shards=shards, writers=writers)
    assert "cannot write checkpoint" in str(err.value) and "No space left" in str(err.value)
    assert "\n" not in str(err.value) and _left(tmp_path) == []


def test_one_process_writes_alone_and_a_full_disk_keeps_the_previous(tmp_path, monkeypatch):
    first = ckpt.save_checkpoint(tmp_path, 1, _files())
    monkeypatch.setattr(ckpt, "save_file", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(CheckpointError, match="previous checkpoint is kept"):
        ckpt.save_checkpoint(tmp_path, 2, _files())
    assert _left(tmp_path) == [first.name]
