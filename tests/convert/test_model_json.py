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


def test_paddlemix_large_dit_json_is_a_large_dit(tmp_path):
    # PaddleMIX's config/LargeDiT_*.json share the DiT files' keys; PaddleMIX picks DiT-LLaMA by file name.
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec

    three_b = tmp_path / "LargeDiT_3B_patch2.json"
    three_b.write_text(json.dumps({"sample_size": 32, "patch_size": 2, "in_channels": 4, "num_layers": 32,
                                   "num_attention_heads": 32, "attention_head_dim": 96, "qk_norm": False}))
    cfg = build_config(three_b)
    assert cfg.model.name == "LargeDiT-3B/2" and cfg.model.options["qk_norm"] is False
    tiny = tmp_path / "LargeDiT_tiny_patch2.json"  # no qk_norm key: ppdiffusers' default turns it on
    tiny.write_text(json.dumps({"sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 2,
                                "num_attention_heads": 4, "attention_head_dim": 16, "num_classes": 10}))
    cfg = build_config(tiny)
    assert cfg.model.name == "LargeDiT-600M/2" and cfg.model.options == {
        "qk_norm": True, "patch_size": 2, "dim": 64, "n_layers": 2, "n_heads": 4}
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    assert len(model.layers) == 2 and model.layers[0].attention.q_norm is not None
    out = model(torch.randn(2, 4, 8, 8), torch.tensor([1, 500]), torch.tensor([0, 9]))
    assert out.shape == (2, 8, 8, 8)
    # A DiT file keeps mapping to a DiT.
    dit = tmp_path / "DiT_XL_patch2.json"
    dit.write_text(json.dumps({"sample_size": 32, "patch_size": 2, "in_channels": 4, "num_layers": 28,
                               "num_attention_heads": 16, "attention_head_dim": 72}))
    assert build_config(dit).model.name == "DiT-XL/2"


def test_paddlemix_sit_json_is_a_sit_trained_as_transport(tmp_path):
    # PaddleMIX's config/SiT_XL_patch2.json holds DiT's keys; its SiT script is what makes it SiT.
    from dit_trainer.config import build_config
    from dit_trainer.objective import build_objective
    from dit_trainer.transport.objective import TransportObjective

    keys = {"input_size": 8, "patch_size": 2, "in_channels": 4, "hidden_size": 64, "depth": 2, "num_heads": 2,
            "mlp_ratio": 4.0, "class_dropout_prob": 0.1, "num_classes": 10, "learn_sigma": True}
    sit, dit = tmp_path / "SiT_tiny_patch2.json", tmp_path / "DiT_tiny_patch2.json"
    for path in (sit, dit):
        path.write_text(json.dumps(keys))
    cfg = build_config(sit)
    assert cfg.model.name == "SiT-S/2" and cfg.objective == "transport"
    assert isinstance(build_objective(cfg), TransportObjective)
    other = build_config(dit)
    assert other.model.name == "DiT-S/2" and other.objective == "diffusion"
