"""model.weights_path takes a run folder as `dit sample --ckpt RUN_DIR` does: its newest finished checkpoint."""

import pytest
import torch
from tests.train.trainer_helpers import tiny_config

from dit_trainer.checkpoint import load_weights, save_checkpoint
from dit_trainer.errors import CheckpointError
from dit_trainer.train import DiTTrainer


def _weights(value):
    return {"w": torch.full((2,), float(value))}


def test_run_folder_gives_newest_finished_checkpoint(tmp_path):
    for step in (10, 20):
        save_checkpoint(tmp_path, step, {"ema.safetensors": _weights(step), "model.safetensors": _weights(-step)})
    (tmp_path / "checkpoints" / "step-00000030.tmp").mkdir()  # a save cut short is no checkpoint
    assert torch.equal(load_weights(tmp_path)["w"], _weights(20)["w"])
    assert torch.equal(load_weights(tmp_path, prefer_ema=False)["w"], _weights(-20)["w"])


def test_folder_without_checkpoints_says_what_to_pass(tmp_path):
    (tmp_path / "config.yaml").write_text("model: {}\n")
    with pytest.raises(CheckpointError, match="no model.safetensors, ema.safetensors or checkpoints/step-\\*; pass a "
                                              "dit-trainer run folder"):
        load_weights(tmp_path)


def test_trainer_starts_from_a_run_folder(tmp_path):
    source = DiTTrainer(tiny_config(tmp_path / "src"))
    source.train_step((torch.randn(8, 4, 8, 8), torch.randint(0, 10, (8,))))
    source.save_checkpoint()
    trainer = DiTTrainer(tiny_config(tmp_path / "dst", model={"weights_path": str(tmp_path / "src")}))
    ema = source.ema.state_dict()
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, ema[name]), name
