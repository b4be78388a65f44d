"""`dit convert --model X.json` and `DiTPipeline.from_pretrained(..., model=X.json)`: a PaddleMIX JSON
gives what a DiT .pt's tensors cannot tell (the head count of a size no release has)."""

import argparse
import json

import pytest
import torch

from dit_trainer.convert import read
from dit_trainer.errors import CheckpointError, ConfigError

# pt_and_json: tests/conftest.py


def _convert(*argv):
    from dit_trainer.convert.cli import add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    args = parser.parse_args(["convert", *map(str, argv)])
    return args.func(args)


def test_convert_model_json(pt_and_json, tmp_path, capsys):
    pt, js, model = pt_and_json
    with pytest.raises(CheckpointError, match="--num-heads"):
        read("dit-pt", pt)  # without the JSON, the heads are unknown
    assert _convert("--from", "dit-pt", pt, "--to", "ours", tmp_path / "out", "--model", js) == 0
    bundle = read("ours", tmp_path / "out")
    assert (bundle.model["depth"], bundle.model["hidden_size"], bundle.model["num_heads"]) == (2, 32, 2)
    assert bundle.model["num_classes"] == 10 and "DiT-S/2" in capsys.readouterr().out
    assert torch.equal(bundle.state_dict["blocks.1.attn.qkv.weight"], model.state_dict()["blocks.1.attn.qkv.weight"])
    # our run folder with the JSON that describes it passes; a JSON of another size is refused
    assert read("ours", tmp_path / "out", model=str(js)).model == bundle.model


def test_json_that_does_not_fit_the_tensors(pt_and_json, tmp_path):
    pt, js, _ = pt_and_json
    other = tmp_path / "deeper.json"
    other.write_text(json.dumps({**json.loads(js.read_text()), "num_layers": 3}))
    with pytest.raises(CheckpointError) as err:
        read("dit-pt", pt, model=str(other))
    assert "blocks.2" in str(err.value) and "\n" not in str(err.value)


def test_pipeline_takes_the_json(pt_and_json, vae_dir):
    from dit_trainer.convert.pipeline import DiTPipeline

    pt, js, model = pt_and_json
    pipe = DiTPipeline.from_pretrained(pt, vae=vae_dir, model=js)
    assert len(pipe.model.blocks) == 2 and pipe.model.num_classes == 10
    assert torch.equal(pipe.model.pos_embed, model.pos_embed)
    images = pipe(class_labels=[3], num_inference_steps=2, guidance_scale=4.0, output_type="np")
    assert images.shape[:3] == (1, 16, 16)  # 8x8 latents through the 2-level test VAE (x2)


def test_bad_json_for_convert_is_one_line(pt_and_json, tmp_path):
    pt, _, _ = pt_and_json
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"layers": 2}))
    with pytest.raises(ConfigError) as err:
        read("dit-pt", pt, model=str(odd))
    assert "odd.json" in str(err.value) and "PaddleMIX" in str(err.value) and "\n" not in str(err.value)
