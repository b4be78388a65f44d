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


def test_train_minimal_takes_the_shape_from_the_data(tmp_path, capsys):
    import json

    import numpy as np

    spec = importlib.util.spec_from_file_location("train_minimal", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.set_num_threads(1)
    data = tmp_path / "latents"
    data.mkdir()
    for i in range(8):
        np.save(data / f"z{i}.npy", np.random.default_rng(i).standard_normal((4, 8, 8)).astype(np.float32))
    (data / "labels.json").write_text(json.dumps({"labels": {f"z{i}": i % 2 for i in range(8)},
                                                  "class_names": ["cat", "dog"]}))
    # No --image-size/--in-channels/--num-classes: 8x8 4-channel latents of 2 classes, as `dit train` reads them.
    assert mod.main(["--data-path", str(data), "--model", "DiT-S/2", "--depth", "1", "--hidden-size", "32",
                     "--num-heads", "2", "--batch-size", "4", "--steps", "2", "--log-every", "1",
                     "--out", str(tmp_path / "run")]) == 2
    weights = load_weights(latest_checkpoint(tmp_path / "run"))
    assert weights["y_embedder.embedding_table.weight"].shape[0] == 2 + 1  # 2 classes and the null class
    assert weights["x_embedder.proj.weight"].shape[1] == 4 and weights["pos_embed"].shape[1] == (8 // 2) ** 2
