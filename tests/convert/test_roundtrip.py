"""ours -> diffusers -> ours and ours -> ppdiffusers -> ours keep every tensor bit for bit."""

import json

import pytest
import torch
from safetensors.torch import load_file

from dit_trainer.convert import convert, read


def _same(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("fmt", ["diffusers", "ppdiffusers"])
def test_ours_roundtrip_bit_identical(fmt, ours_dir, tmp_path):
    mid, _ = convert("ours", ours_dir, fmt, tmp_path / fmt)
    back, bundle = convert(fmt, mid, "ours", tmp_path / "back", convention="release")
    _same(load_file(str(ours_dir / "ema.safetensors")), load_file(str(back / "ema.safetensors")))
    original = read("ours", ours_dir)
    assert bundle.model == original.model  # the release convention, when asked for, restores the config
    assert bundle.class_names == original.class_names and bundle.scaling_factor == original.scaling_factor
    # The VAE travels too (through paddle's layout for ppdiffusers).
    _same(load_file(str(ours_dir / "vae" / "diffusion_pytorch_model.safetensors")),
          load_file(str(back / "vae" / "diffusion_pytorch_model.safetensors")))


def test_import_records_diffusers_convention(ours_dir, tmp_path):
    mid, _ = convert("ours", ours_dir, "diffusers", tmp_path / "d")
    _, bundle = convert("diffusers", mid, "ours", tmp_path / "back")
    assert bundle.model["timestep_freq_shift"] == 1
    text = (tmp_path / "back" / "config.yaml").read_text()
    assert "timestep_freq_shift: 1" in text


def test_pipeline_folder_layout(ours_dir, tmp_path):
    d, _ = convert("ours", ours_dir, "diffusers", tmp_path / "d")
    p, _ = convert("ours", ours_dir, "ppdiffusers", tmp_path / "p")
    for root, weights in ((d, "diffusion_pytorch_model.safetensors"), (p, "model_state.pdparams")):
        index = json.loads((root / "model_index.json").read_text())
        assert index["_class_name"] == "DiTPipeline" and index["id2label"]["3"] == "thing 3, alias 3"
        assert (root / "transformer" / weights).is_file() and (root / "vae" / "config.json").is_file()
        sched = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
        assert (sched["_class_name"], sched["beta_schedule"], sched["beta_start"], sched["beta_end"]) == \
            ("DDIMScheduler", "linear", 1e-4, 0.02)
    assert json.loads((p / "transformer" / "config.json").read_text())["_class_name"] == "Transformer2DModel"
    assert json.loads((d / "vae" / "config.json").read_text())["scaling_factor"] == 0.5


@pytest.mark.parametrize("name", [f"DiT-{s}/{p}" for s in ("S", "B", "L", "XL") for p in (2, 4, 8)])
def test_every_size_maps_onto_diffusers_transformer(name):
    """Key set and every shape of the export equal a DiTTransformer2DModel built from the exported config."""
    from diffusers import DiTTransformer2DModel

    from dit_trainer.convert.diffusers_names import to_diffusers
    from dit_trainer.convert.pipeline_folder import model_from_transformer_config, transformer_config
    from dit_trainer.models.dit import DiT_models

    model_cfg = {"name": name, "input_size": 32, "in_channels": 4, "num_classes": 1000}
    with torch.device("meta"):
        ours = DiT_models[name](input_size=32).state_dict()
        tcfg = transformer_config(model_cfg, "DiTTransformer2DModel")
        theirs = DiTTransformer2DModel(**{k: v for k, v in tcfg.items() if not k.startswith("_")}).state_dict()
    exported = to_diffusers(ours)
    assert {k: tuple(v.shape) for k, v in exported.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    back = model_from_transformer_config(tcfg, "config", convention="release")
    assert back == {**model_cfg, "learn_sigma": True, "class_dropout_prob": 0.1}


def test_written_folder_loads_with_dit_sample(ours_dir):
    from dit_trainer.sample import load_model

    model, cfg = load_model(str(ours_dir))
    assert cfg.model.options["depth"] == 2 and cfg.data.vae.endswith("vae")
    assert torch.equal(model.state_dict()["blocks.1.mlp.fc2.weight"],
                       load_file(str(ours_dir / "ema.safetensors"))["blocks.1.mlp.fc2.weight"])


@pytest.mark.parametrize("convention,eps", [("diffusers", 1e-5), ("release", 1e-6)])
def test_config_without_norm_eps_takes_the_conventions_eps(convention, eps):
    # The Hub's DiT folders (facebook/DiT-XL-2-256) record no norm_eps; their weights are the release's.
    from dit_trainer.convert.model_config import convention_of
    from dit_trainer.convert.pipeline_folder import model_from_transformer_config

    tcfg = {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 32, "patch_size": 2, "sample_size": 8,
            "in_channels": 4, "out_channels": 8, "num_embeds_ada_norm": 10}
    assert convention_of(model_from_transformer_config(tcfg, "config", convention=convention))["mlp_norm_eps"] == eps
    recorded = model_from_transformer_config({**tcfg, "norm_eps": 1e-5}, "config", convention="release")
    assert convention_of(recorded)["mlp_norm_eps"] == 1e-5  # a recorded eps is what the weights ran with
