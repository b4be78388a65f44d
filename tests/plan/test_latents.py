"""`dit plan` prices the latents the data or VAE makes: channels and side from the shards' manifest or
the VAE folder's config (f16c32, f32c32), not the SD VAE's 4 channels at 1/8."""

import json

import pytest

from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.plan.latents import PlanShapes


def _manifest(folder, shape, image_size):
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({
        "format": "dit-trainer-latent-shards", "version": 1, "count": 0, "latent_shape": shape, "dtype": "float16",
        "num_classes": 10, "class_names": None, "vae": "some/vae", "scaling_factor": 1.0, "image_size": image_size,
        "flips": False, "posterior": "sample", "shards": []}))
    return str(folder)


def _vae_folder(folder, config):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_shapes_follow_the_shards_manifest(tmp_path):
    data = _manifest(tmp_path / "shards", [32, 16, 16], 256)
    cfg = build_config(None, ["--data.path", data], shapes=PlanShapes())
    assert (cfg.model.in_channels, cfg.model.input_size) == (32, 16)
    assert build_config(None, ["--data.path", data], shapes=PlanShapes(256)).model.input_size == 16
    with pytest.raises(ConfigError, match=r"--image-size 512 gives 32-wide latents but .*manifest.json holds 16-wide"):
        build_config(None, ["--data.path", data], shapes=PlanShapes(512))
    with pytest.raises(ConfigError, match=r"model.in_channels is 4 but .*manifest.json makes 32-channel latents; set "
                                          r"model.in_channels to 32 or leave it out"):
        build_config(None, ["--data.path", data, "--model.in_channels", "4"], shapes=PlanShapes())


def test_image_size_divides_by_the_vae_factor(tmp_path):
    dc = _vae_folder(tmp_path / "dc", {"_class_name": "AutoencoderDC", "latent_channels": 32,
                                       "encoder_block_out_channels": [128, 256, 512, 512, 1024, 1024]})
    kl = _vae_folder(tmp_path / "kl", {"_class_name": "AutoencoderKL", "latent_channels": 32,
                                       "block_out_channels": [128, 256, 256, 512, 512]})
    cfg = build_config(None, ["--data.vae", dc], shapes=PlanShapes(512))
    assert (cfg.model.in_channels, cfg.model.input_size) == (32, 16)  # f32c32
    cfg = build_config(None, ["--data.vae", kl], shapes=PlanShapes(256))
    assert (cfg.model.in_channels, cfg.model.input_size) == (32, 16)  # f16c32
    with pytest.raises(ConfigError, match=r"--image-size 200 is not a multiple of 32"):
        build_config(None, ["--data.vae", dc], shapes=PlanShapes(200))
    # No data and no VAE folder: the SD VAE's 1/8, the model's default channels.
    cfg = build_config(None, [], shapes=PlanShapes(512))
    assert (cfg.model.in_channels, cfg.model.input_size) == (4, 64)


def test_plan_refuses_a_mismatch_in_one_line(tmp_path, capsys):
    data = _manifest(tmp_path / "shards", [32, 8, 8], 256)
    assert main(["plan", "--model", "DiT-S/2", "--data.path", data, "--model.input_size", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.input_size is 16 but" in err and "8x8 latents" in err
