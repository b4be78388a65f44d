"""Released checkpoints in: the size read off the tensors, PaddleMIX JSON configs, the CLI."""

import json

import pytest
import torch

from dit_trainer.convert import load_paddlemix_json, read
from dit_trainer.convert.model_config import build_dit, infer_from_state_dict

from tests.convert.convert_helpers import TINY, randomize


@pytest.mark.parametrize("name", ["DiT-XL/2", "DiT-L/4", "DiT-B/8", "DiT-S/2"])
def test_every_release_size_inferred(name):
    from dit_trainer.models.dit import DiT_models

    with torch.device("meta"):
        model = DiT_models[name](input_size=32, num_classes=1000)
    cfg = infer_from_state_dict(model.state_dict())
    assert cfg == {"name": name, "input_size": 32, "in_channels": 4, "num_classes": 1000, "learn_sigma": True,
                   "class_dropout_prob": 0.1}


def test_training_dict_prefers_ema_and_cli(tmp_path, capsys):
    from dit_trainer.convert.cli import add_commands
    import argparse

    model = randomize(build_dit(TINY))
    ema = {k: v + 1 if k != "pos_embed" else v for k, v in model.state_dict().items()}
    torch.save({"model": model.state_dict(), "ema": ema, "opt": {}}, tmp_path / "0001000.pt")
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    args = parser.parse_args(["convert", "--from", "dit-pt", str(tmp_path / "0001000.pt"), "--to", "ours",
                              str(tmp_path / "out"), "--num-heads", "2"])
    assert args.func(args) == 0
    bundle = read("ours", tmp_path / "out")
    assert torch.equal(bundle.state_dict["blocks.0.attn.qkv.weight"], ema["blocks.0.attn.qkv.weight"])
    assert bundle.model["num_heads"] == 2 and bundle.model["depth"] == 2
    # The size name alone would claim a 12-block DiT-S/2: the message names the overrides too.
    assert "wrote DiT-S/2 (depth 2, hidden_size 64, num_heads 2; " in capsys.readouterr().out


@pytest.mark.parametrize("data,name", [
    ({"sample_size": 32, "patch_size": 2, "in_channels": 4, "num_layers": 28, "num_attention_heads": 16,
      "attention_head_dim": 72}, "DiT-XL/2"),
    ({"input_size": 32, "patch_size": 4, "in_channels": 4, "hidden_size": 384, "depth": 12, "num_heads": 6,
      "mlp_ratio": 4.0, "class_dropout_prob": 0.1, "num_classes": 1000, "learn_sigma": True}, "DiT-S/4"),
])
def test_paddlemix_json(tmp_path, data, name):
    from dit_trainer.config import build_config

    path = tmp_path / "DiT.json"
    path.write_text(json.dumps(data))
    cfg = load_paddlemix_json(path)
    assert cfg["name"] == name and cfg["input_size"] == 32 and "depth" not in cfg
    assert build_config({"model": cfg}).model.name == name  # a valid model: section


def test_no_release_size_needs_its_head_count(tmp_path):
    # No tensor holds the head count, and a wrong one computes another function: never guessed.
    from dit_trainer.errors import CheckpointError

    model = randomize(build_dit(TINY), std=0.3)
    torch.save(model.state_dict(), tmp_path / "tiny.pt")
    with pytest.raises(CheckpointError) as err:
        read("dit-pt", tmp_path / "tiny.pt")
    msg = str(err.value)
    assert "depth 2 and hidden size 64 is no release size" in msg and "as --num-heads" in msg and "\n" not in msg
    bundle = read("dit-pt", tmp_path / "tiny.pt", num_heads=2)
    assert bundle.model["num_heads"] == 2
    converted = build_dit(bundle.model)
    converted.load_state_dict(bundle.state_dict)
    x, t, y = torch.randn(2, 4, 8, 8), torch.tensor([3, 700]), torch.tensor([1, 4])
    torch.testing.assert_close(converted(x, t, y), model(x, t, y), rtol=1e-5, atol=1e-5)
    with pytest.raises(CheckpointError, match="does not divide the hidden size 64"):
        read("dit-pt", tmp_path / "tiny.pt", num_heads=3)
    with pytest.raises(CheckpointError, match="drop --num-heads"):
        read("dit-pt", tmp_path / "tiny.pt", model="DiT-S/2", num_heads=2)
