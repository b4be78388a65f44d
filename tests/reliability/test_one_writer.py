"""One writer per output_dir, no run in the user's own folder, and readers that outlive rotation."""

import os
import socket

import pytest
import torch
import yaml
from tests.reliability.helpers import names, train
from tests.train.trainer_helpers import run_config

from dit_trainer import checkpoint
from dit_trainer.checkpoint import files as ckpt
from dit_trainer.cli import main
from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics
from dit_trainer.train.run_lock import LOCK_NAME, RunLock


def _config_file(tmp_path, steps=2, **sections):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(run_config(tmp_path, steps, keep=0, **sections)))
    return str(path)


def test_current_folder_as_output_dir_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "config.yaml"
    mine.write_text("my: own notes\n")
    for out in (".", str(tmp_path), ".."):
        cfg = run_config(tmp_path, 2, keep=0)
        cfg["output_dir"] = out
        with pytest.raises(CheckpointError, match="current folder") as err:
            DiTTrainer(cfg).train()
        assert "\n" not in str(err.value)
    assert mine.read_text() == "my: own notes\n" and not (tmp_path / "metrics.jsonl").exists()
    # The same with archive, which would otherwise move the current folder away.
    config = _config_file(tmp_path, checkpoint={"resume": False, "on_existing": "archive"})
    assert main(["train", "--config", config, "--output_dir", "."]) == 2
    assert "current folder" in capsys.readouterr().err
    cfg = run_config(tmp_path, 2, keep=0)
    cfg["output_dir"] = ""
    with pytest.raises(ConfigError, match="output_dir is empty"):
        DiTTrainer(cfg)


def test_second_train_on_a_held_folder_is_one_line(tmp_path, capsys):
    config = _config_file(tmp_path, optim={"lr": 1e-3})
    out = tmp_path / "run"
    with RunLock(out, is_main=True):  # what a first `dit train` holds for its whole run
        assert main(["train", "--config", config]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "in use by another dit train" in err
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in err
    assert not (out / "metrics.jsonl").exists() and names(tmp_path) == []
    # Released at the end (or by the kernel when the holder dies): the folder trains again.
    assert main(["train", "--config", config]) == 0 and names(tmp_path) == ["step-00000002"]


def test_stale_lock_file_and_tmp_of_a_killed_run_do_not_block(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / "step-00000002.tmp").mkdir(parents=True)
    (out / LOCK_NAME).write_text('{"pid": 999999, "host": "gone", "since": "then"}')  # kill -9 leaves it
    assert train(tmp_path, 2).step == 2
    assert not list((out / "checkpoints").glob("*.tmp")) and names(tmp_path) == ["step-00000002"]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]


def test_reader_moves_to_the_newest_when_rotation_removes_its_checkpoint(tmp_path, capsys):
    def files(value):
        return {"ema.safetensors": {"w": torch.full((4,), value)}, "model.safetensors": {"w": torch.zeros(4)}}

    ckpt.save_checkpoint(tmp_path / "run", 1, files(1.0))
    reader = checkpoint.open(tmp_path / "run")
    assert reader.path.name == "step-00000001"
    ckpt.save_checkpoint(tmp_path / "run", 2, files(2.0), keep=1)  # a training run rotates meanwhile
    assert torch.equal(reader.weights("ema")["w"], torch.full((4,), 2.0))
    assert reader.path.name == "step-00000002" and "was removed while it was read" in capsys.readouterr().err
    # A checkpoint folder named directly has no run to fall back on: its loss is an error.
    direct = checkpoint.open(tmp_path / "run" / "checkpoints" / "step-00000002")
    ckpt.save_checkpoint(tmp_path / "run", 3, files(3.0), keep=1)
    with pytest.raises(CheckpointError):
        direct.weights("ema")
