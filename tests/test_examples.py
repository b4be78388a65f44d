"""examples/train_minimal.py runs a few steps and leaves a checkpoint `dit sample` can read."""

import importlib.util
from pathlib import Path

import torch

from dit_trainer.checkpoint import latest_checkpoint, load_weights

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_minimal.py"


def test_train_minimal_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("train_minimal", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.set_num_threads(1)
    steps = mod.main(["--data-path", "digits", "--model", "DiT-S/4", "--image-size", "16", "--in-channels", "1",
                      "--num-classes", "10", "--depth", "1", "--hidden-size", "32", "--num-heads", "2",
                      "--batch-size", "8", "--steps", "4", "--log-every", "2", "--out", str(tmp_path)])
    assert steps == 4
    out = capsys.readouterr().out
    assert out.count("loss") == 2
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "step-00000004"
    assert "final_layer.linear.weight" in load_weights(ckpt)
