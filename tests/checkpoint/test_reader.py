"""checkpoint.open: a run folder, a checkpoint folder or a weights file, resolved once; its config and
its weights, from safetensors files or from dcp/ shards alike."""

import argparse

import pytest
import torch
import yaml
from safetensors.torch import save_file

from dit_trainer import checkpoint
from dit_trainer.checkpoint import begin_checkpoint, commit_checkpoint, save_checkpoint
from dit_trainer.checkpoint.files import write_manifest
from dit_trainer.checkpoint.sharded import save_sharded
from dit_trainer.errors import CheckpointError
from dit_trainer.models import DiT


def _tiny(seed):
    torch.manual_seed(seed)
    model = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=1, num_heads=2, num_classes=4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return model


def _equal(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


CONFIG = yaml.safe_dump({"model": {"name": "DiT-S/2", "input_size": 8, "num_classes": 4}})


def test_a_run_folder_opens_its_newest_checkpoint(tmp_path, monkeypatch):
    trained, averaged = _tiny(1).state_dict(), _tiny(2).state_dict()
    save_checkpoint(tmp_path / "run", 1, {"ema.safetensors": trained, "model.safetensors": trained})
    newest = save_checkpoint(tmp_path / "run", 2, {"ema.safetensors": averaged, "model.safetensors": trained,
                                                   "config.yaml": CONFIG})
    monkeypatch.chdir(tmp_path)
    reader = checkpoint.open("run")
    assert reader.folder == newest.resolve() and reader.path.is_absolute() and reader.file is None
    assert checkpoint.open(reader) is reader and checkpoint.open(newest).folder == reader.folder
    assert reader.config_file == reader.folder / "config.yaml" and reader.config().model.num_classes == 4
    assert _equal(reader.weights(), averaged) and _equal(reader.weights("model"), trained)
    assert not reader.sharded and len(reader.manifest_digest()) == 16
    with pytest.raises(ValueError, match="'raw' is not one of ema, model"):
        reader.weights("raw")


def test_a_weights_file_has_no_config(tmp_path):
    save_file(_tiny(3).state_dict(), str(tmp_path / "w.safetensors"))
    reader = checkpoint.open(tmp_path / "w.safetensors")
    assert reader.folder is None and reader.file == tmp_path / "w.safetensors"
    assert reader.config_file is None and reader.config() is None and reader.manifest_digest() is None
    assert _equal(reader.weights(), _tiny(3).state_dict())


def test_nothing_to_open_is_one_line_naming_the_flag(tmp_path):
    with pytest.raises(CheckpointError, match=f"^--ckpt {tmp_path / 'gone'} does not exist; pass a run folder"):
        checkpoint.open(tmp_path / "gone", flag="--ckpt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty holds no checkpoint: no model.safetensors") as err:
        checkpoint.open(tmp_path / "empty")
    assert "\n" not in str(err.value)


def test_a_sharded_checkpoint_gives_its_training_weights_from_dcp(tmp_path):
    trained, averaged = _tiny(4), _tiny(5).state_dict()
    # What a sharded run writes: dcp/ (model, EMA), ema.safetensors and config.yaml, no model.safetensors.
    tmp = begin_checkpoint(tmp_path, 3)
    save_sharded(tmp / "dcp", trained, ema=argparse.Namespace(state_dict=lambda: averaged))
    save_file(averaged, str(tmp / "ema.safetensors"))
    (tmp / "config.yaml").write_text(CONFIG)
    write_manifest(tmp)
    reader = checkpoint.open(commit_checkpoint(tmp))
    assert reader.sharded
    assert _equal(reader.weights("model"), trained.state_dict()) and _equal(reader.weights("ema"), averaged)
