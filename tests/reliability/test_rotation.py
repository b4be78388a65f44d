"""Rotation never deletes the last good checkpoint; resume_from is checked as plain resume is, and a
branch moves the newer checkpoints aside instead of deleting them."""

import shutil

import pytest
import torch
from tests.reliability.helpers import edit_weights, names, step_dir, train
from tests.train.trainer_helpers import run_config

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.errors import CheckpointError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_rotation_counts_only_verified_checkpoints(tmp_path):
    files = {"model.safetensors": {"w": torch.zeros(64)}, "config.yaml": "x: 1\n"}
    ckpt.save_checkpoint(tmp_path, 2, files)
    ckpt.save_checkpoint(tmp_path, 9, files)
    _truncate(tmp_path / "checkpoints" / "step-00000009" / "model.safetensors")  # a broken newer one
    ckpt.save_checkpoint(tmp_path, 4, files, keep=1)
    # The new step-4 is the one good checkpoint kept; the broken step-9 takes no good one's place.
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000004", "step-00000009"]
    ckpt.save_checkpoint(tmp_path, 6, files, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000004", "step-00000006", "step-00000009"]


def test_broken_newer_checkpoint_with_limit_1_keeps_the_good_one(tmp_path):
    train(tmp_path, 4, keep=1)
    broken = step_dir(tmp_path, 6)
    shutil.copytree(step_dir(tmp_path, 4), broken)
    _truncate(broken / "model.safetensors")
    with pytest.warns(UserWarning, match="moved the checkpoints newer than step 4"):
        train(tmp_path, 6, keep=1)
    assert names(tmp_path) == ["step-00000006"]
    ckpt.verify_checkpoint(step_dir(tmp_path, 6))
    abandoned = list((tmp_path / "run" / "checkpoints").glob("abandoned-*/step-00000006"))
    assert len(abandoned) == 1  # the broken one, moved aside rather than deleted
    assert train(tmp_path, 8, keep=1).step == 8  # and the next resume finds its checkpoint


@pytest.mark.parametrize("damage", ["nan_with_manifest", "flipped_byte"])
def test_resume_from_is_verified(tmp_path, damage):
    train(tmp_path, 4)
    target = step_dir(tmp_path, 2)
    if damage == "nan_with_manifest":
        edit_weights(target, "ema.safetensors", lambda sd: {k: v.fill_(float("nan")) for k, v in sd.items()})
    else:
        data = bytearray((target / "ema.safetensors").read_bytes())
        data[-10] ^= 0x01
        (target / "ema.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="resume_from") as err:
        train(tmp_path, 6, checkpoint={"resume_from": "2", "save_steps": 2})
    assert "\n" not in str(err.value) and ("non-finite" in str(err.value) or "sha256" in str(err.value))
    assert names(tmp_path) == ["step-00000002", "step-00000004"]  # nothing moved, nothing rotated


def test_branch_from_an_older_step_continues_on_rerun(tmp_path):
    train(tmp_path, 6)
    with pytest.warns(UserWarning, match="moved the checkpoints newer than step 2"):
        branch = train(tmp_path, 4, checkpoint={"resume_from": "2", "save_steps": 2})
    abandoned = next((tmp_path / "run" / "checkpoints").glob("abandoned-*"))
    assert sorted(p.name for p in abandoned.iterdir()) == ["metrics.jsonl", "step-00000004", "step-00000006"]
    assert [r["step"] for r in read_metrics(abandoned / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    rerun = train(tmp_path, 6)
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert names(tmp_path) == ["step-00000002", "step-00000004", "step-00000006"]
    assert rerun.step == 6 and branch.step == 4


def test_truncated_config_in_newest_falls_back(tmp_path):
    train(tmp_path, 4)
    config = step_dir(tmp_path, 4) / "config.yaml"
    text = config.read_text()
    config.write_text(text[: text.index("input_size:") + len("input_size:")])  # still YAML: input_size null
    with pytest.warns(UserWarning, match="skipping checkpoint step-00000004"):
        trainer = DiTTrainer(run_config(tmp_path, 6, keep=0))
        assert trainer.maybe_resume().name == "step-00000002"

