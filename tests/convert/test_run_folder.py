"""Training run folders export: latents of `dit extract` (shift_factor 0.0) and EMA-rounded pos_embed."""

import json
import shutil

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from dit_trainer.convert import convert, read
from dit_trainer.convert.pipeline import DiTPipeline
from dit_trainer.errors import CheckpointError, ConfigError


def _run(root, ours_dir, shift=0.0, pos_noise=0.0):
    """A run folder trained on extracted latents whose manifest records `shift` and the VAE."""
    latents = root / "latents"
    latents.mkdir(parents=True)
    cfg = yaml.safe_load((ours_dir / "config.yaml").read_text())
    manifest = {"format": "dit-trainer-latent-shards", "version": 1, "count": 1, "latent_shape": [4, 8, 8],
                "dtype": "float16", "num_classes": 10, "class_names": None, "vae": str(ours_dir / "vae"),
                "scaling_factor": 0.5, "shift_factor": shift, "image_size": 16, "flips": True,
                "posterior": "mean_std", "shards": [{"name": "shard-00000", "count": 1}]}
    (latents / "manifest.json").write_text(json.dumps(manifest))
    cfg["data"].update({"path": str(latents), "vae": None})
    step = root / "run" / "checkpoints" / "step-00000010"
    step.mkdir(parents=True)
    (step / "config.yaml").write_text(yaml.safe_dump(cfg))
    sd = load_file(str(ours_dir / "ema.safetensors"))
    sd["pos_embed"] = sd["pos_embed"] + pos_noise * torch.randn(sd["pos_embed"].shape, generator=torch.Generator().manual_seed(0))
    save_file(sd, str(step / "ema.safetensors"))
    shutil.copy(ours_dir / "labels.json", step / "labels.json")
    return root / "run"


def test_zero_shift_run_exports_and_loads(ours_dir, tmp_path):
    run = _run(tmp_path, ours_dir, shift=0.0)
    out, bundle = convert("ours", run, "diffusers", tmp_path / "d")
    assert bundle.scaling_factor == 0.5 and (out / "vae" / "config.json").is_file()
    images = DiTPipeline.from_pretrained(run)(class_labels=[1], num_inference_steps=2, output_type="np")
    assert images.shape == (1, 16, 16, 3) and np.isfinite(images).all()


def test_nonzero_shift_refused(ours_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"shift factor \(0.1\)"):
        read("ours", _run(tmp_path, ours_dir, shift=0.1))


def test_ema_rounding_of_pos_embed_exports(ours_dir, tmp_path):
    # What an fp32 EMA (mul then add) leaves of the fixed table: ~1e-6 here, at most ~6e-4.
    run = _run(tmp_path, ours_dir, pos_noise=1e-6)
    out, _ = convert("ours", run, "diffusers", tmp_path / "d")
    back = read("diffusers", out, convention="release")
    exact = load_file(str(ours_dir / "ema.safetensors"))["pos_embed"]
    assert torch.equal(back.state_dict["pos_embed"], exact)  # the export carries DiT's exact table


def test_other_pos_embed_refused_with_its_difference(ours_dir, tmp_path):
    run = _run(tmp_path, ours_dir, pos_noise=0.05)
    with pytest.raises(CheckpointError, match=r"pos_embed differs from DiT's fixed sin-cos table by up to 0\.\d+ "):
        convert("ours", run, "diffusers", tmp_path / "d")


def test_transport_run_keeps_its_objective_and_is_not_exported_as_ddim(ours_dir, tmp_path):
    run = _run(tmp_path, ours_dir)
    step = run / "checkpoints" / "step-00000010"
    cfg = yaml.safe_load((step / "config.yaml").read_text())
    cfg.update({"objective": "transport", "transport": {"path_type": "GVP", "prediction": "velocity"}})
    (step / "config.yaml").write_text(yaml.safe_dump(cfg))

    bundle = read("ours", run)
    assert bundle.transport["path_type"] == "GVP" and bundle.transport["prediction"] == "velocity"
    pipe = DiTPipeline.from_pretrained(run)
    assert pipe.cfg.objective == "transport" and pipe.cfg.transport.path_type == "GVP"
    images = pipe(class_labels=[1], num_inference_steps=2, output_type="np")  # the ODE, not DDIM
    assert images.shape == (1, 16, 16, 3) and np.isfinite(images).all()
    for fmt in ("diffusers", "ppdiffusers"):
        with pytest.raises(ConfigError, match="objective transport.*cannot sample"):
            convert("ours", run, fmt, tmp_path / fmt)
        assert not (tmp_path / fmt).exists()
    out, _ = convert("ours", run, "ours", tmp_path / "o")
    back = read("ours", out)
    assert back.transport == bundle.transport
    assert read("ours", ours_dir).transport is None


def test_converted_folder_with_its_vae_can_be_moved(ours_dir, tmp_path):
    # The vae/ a converted folder carries is recorded relative to it, as diffusers folders do.
    out, _ = convert("ours", ours_dir, "ours", tmp_path / "a")
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["vae"] == "vae"
    moved = tmp_path / "elsewhere" / "b"
    shutil.move(str(out), str(moved))
    bundle = read("ours", moved)
    assert bundle.vae == str((moved / "vae").resolve())
    images = DiTPipeline.from_pretrained(moved)(class_labels=[1], num_inference_steps=2, output_type="np")
    assert images.shape == (1, 16, 16, 3) and np.isfinite(images).all()
    from dit_trainer.sample.loading import load_model

    assert load_model(moved)[1].data.vae == str((moved / "vae").resolve())
