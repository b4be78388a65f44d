"""`dit sample --ckpt weights.pt --model X.json`: the model, its latent size and classes from a PaddleMIX JSON."""

import json

import pytest
import torch

import dit_trainer.sample.loading as L
from dit_trainer.errors import ConfigError
from dit_trainer.config.model_file import load_model_file

# pt_and_json: tests/conftest.py


def test_weights_file_with_model_json(pt_and_json):
    pt, js, want = pt_and_json
    model, cfg = L.load_model(pt, str(js))
    assert (cfg.model.options["depth"], cfg.model.options["hidden_size"], cfg.model.options["num_heads"], cfg.model.num_classes) == (2, 32, 2, 10)
    assert cfg.data.image_size == 64 and cfg.data.vae == L.DEFAULT_VAE  # 8x8 latents of SD's VAE
    assert torch.equal(model.y_embedder.embedding_table.weight, want.y_embedder.embedding_table.weight)
    with pytest.raises(ConfigError, match="--image-size 256 does not fit"):
        L.load_model(pt, str(js), image_size=256)


def test_checkpoint_folder_and_json_must_agree(pt_and_json, tmp_path):
    from dit_trainer.convert import Bundle, write

    pt, js, want = pt_and_json
    folder = write("ours", Bundle(state_dict=want.state_dict(), model=load_model_file(js)), tmp_path / "ckpt")
    model, _ = L.load_model(folder, str(js))  # the JSON it was trained from
    assert len(model.blocks) == 2
    other = tmp_path / "wide.json"
    other.write_text(json.dumps({**json.loads(js.read_text()), "attention_head_dim": 32}))
    with pytest.raises(ConfigError) as err:
        L.load_model(folder, str(other))
    assert "hidden_size 64" in str(err.value) and "hidden_size 32" in str(err.value) and "\n" not in str(err.value)


def test_run_folder_without_checkpoint_says_so(tmp_path):
    from dit_trainer.errors import CheckpointError

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("model:\n  name: DiT-S/2\n")
    with pytest.raises(CheckpointError, match="has a config.yaml but no checkpoint yet") as err:
        L.load_model(tmp_path / "run")
    assert "has no config.yaml" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        L.load_model(tmp_path / "empty")


def test_sit_weights_sample_as_transport(pt_and_json, tmp_path):
    # A SiT release's .pt has DiT's tensor names: the model named (or PaddleMIX's SiT_ JSON) decides
    # the head and, through objective auto, the sampler. Before, it sampled as DDPM diffusion.
    from dit_trainer.models import SiT

    pt, js, _ = pt_and_json
    sit_json = tmp_path / "SiT_tiny_patch2.json"
    sit_json.write_text(js.read_text())
    model, cfg = L.load_model(pt, str(sit_json))
    assert isinstance(model, SiT) and cfg.objective == "transport"
    model, cfg = L.load_model(pt, str(js))
    assert not isinstance(model, SiT) and cfg.objective == "diffusion"
