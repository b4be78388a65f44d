"""Resume takes the newest checkpoint that is whole: checksums, truncation, empty folders, NaN weights."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.train.trainer_helpers import tiny_config, write_npy_latents

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.errors import CheckpointError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics


def _cfg(tmp_path, out, steps, **sections):
    data = tmp_path / "latents"
    if not data.exists():
        write_npy_latents(data, n=8)
    sections.setdefault("checkpoint", {"save_steps": 2, "save_total_limit": 0})
    return tiny_config(tmp_path / out, data={"path": str(data)}, train={"max_steps": steps, "global_batch_size": 4},
                       **sections)


def _same(a, b):
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_truncated_newest_is_skipped_and_run_ends_equal(tmp_path):
    straight = DiTTrainer(_cfg(tmp_path, "a", 6))
    straight.train()
    DiTTrainer(_cfg(tmp_path, "b", 4)).train()
    newest = tmp_path / "b" / "checkpoints" / "step-00000004" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    resumed = DiTTrainer(_cfg(tmp_path, "b", 6))
    with pytest.warns(UserWarning) as record:
        resumed.train()
    messages = [str(w.message) for w in record]
    assert any("step-00000004" in m and "truncated" in m for m in messages), messages
    assert any("resuming from" in m and "step-00000002" in m for m in messages), messages
    assert resumed.step == 6
    _same(straight.model, resumed.model)
    _same(straight.ema, resumed.ema)
    a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


def _damage(folder, how):
    if how == "empty":
        shutil.rmtree(folder)
        folder.mkdir()
    elif how == "flipped":
        path = folder / "ema.safetensors"
        data = bytearray(path.read_bytes())
        for i in range(len(data) - 64, len(data)):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "nan":
        # Non-finite but consistent with the manifest: only the weight check catches it.
        path = folder / "model.safetensors"
        sd = load_file(str(path))
        sd[next(iter(sd))][0] = float("nan")
        save_file(sd, str(path))
        ckpt.write_manifest(folder)
    elif how == "legacy_truncated":
        (folder / ckpt.MANIFEST).unlink()
        path = folder / "optimizer.pt"
        path.write_bytes(path.read_bytes()[:100])
    elif how == "bad_manifest":
        (folder / ckpt.MANIFEST).write_text("{not json")


@pytest.mark.parametrize("how", ["empty", "flipped", "nan", "legacy_truncated", "bad_manifest"])
def test_damaged_newest_falls_back(tmp_path, how):
    DiTTrainer(_cfg(tmp_path, "run", 4)).train()
    _damage(tmp_path / "run" / "checkpoints" / "step-00000004", how)
    trainer = DiTTrainer(_cfg(tmp_path, "run", 4))
    trainer.loader = trainer.build_loader()
    with pytest.warns(UserWarning, match="skipping checkpoint .*step-00000004"):
        assert trainer.maybe_resume().name == "step-00000002"
    assert trainer.step == 2


def test_truncated_dcp_shard_falls_back(tmp_path):
    cfg = _cfg(tmp_path, "run", 4, checkpoint={"save_steps": 2, "sharded": True})
    DiTTrainer(cfg).train()
    shard = next((tmp_path / "run" / "checkpoints" / "step-00000004" / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:1000])
    (tmp_path / "run" / "checkpoints" / "step-00000004" / ckpt.MANIFEST).unlink()  # only DCP can notice now
    trainer = DiTTrainer(cfg)
    trainer.loader = trainer.build_loader()
    with pytest.warns(UserWarning, match="skipping checkpoint .*step-00000004"):
        assert trainer.maybe_resume().name == "step-00000002"


def test_no_usable_checkpoint_is_one_line(tmp_path):
    DiTTrainer(_cfg(tmp_path, "run", 2)).train()
    _damage(tmp_path / "run" / "checkpoints" / "step-00000002", "flipped")
    trainer = DiTTrainer(_cfg(tmp_path, "run", 4))
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="no usable checkpoint") as err:
        trainer.train()
    assert "\n" not in str(err.value)


def test_weights_readers_one_line(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    for bad in (path, tmp_path / "missing.safetensors"):
        with pytest.raises(CheckpointError) as err:
            ckpt.load_safetensors(bad)
        assert "\n" not in str(err.value) and str(bad) in str(err.value)


def test_manifest_lists_every_file(tmp_path):
    DiTTrainer(_cfg(tmp_path, "run", 2)).train()
    folder = tmp_path / "run" / "checkpoints" / "step-00000002"
    listed = set(json.loads((folder / ckpt.MANIFEST).read_text())["files"])
    assert listed == {p.name for p in folder.iterdir()} - {ckpt.MANIFEST}
    ckpt.verify_checkpoint(folder)


def test_sampling_weights_are_checked(tmp_path):
    # What `dit sample` and model.weights_path read: a damaged or NaN EMA is refused, not sampled black.
    DiTTrainer(_cfg(tmp_path, "run", 2)).train()
    folder = tmp_path / "run" / "checkpoints" / "step-00000002"
    assert ckpt.load_weights(folder)
    _damage(folder, "flipped")
    with pytest.raises(CheckpointError, match="ema.safetensors fails its checksum"):
        ckpt.load_weights(folder)
    sd = ckpt.load_weights(folder, prefer_ema=False)
    sd[next(iter(sd))][0] = float("inf")
    save_file(sd, str(tmp_path / "nan.safetensors"))
    with pytest.raises(CheckpointError, match="holds NaN or inf"):
        ckpt.load_weights(tmp_path / "nan.safetensors")
