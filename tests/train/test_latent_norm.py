"""Per-channel latent statistics from `dit extract` through training and sampling, with no flag:
the trainer normalises, the run's config.yaml keeps them, `dit sample` undoes them before the VAE."""

import json

import pytest
import torch
import yaml

pytest.importorskip("diffusers")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.data.shards import MANIFEST, read_manifest  # noqa: E402
from tests.train.trainer_helpers import tiny_config  # noqa: E402
from tests.vae.autoencoders import save_kl_f16c32, write_images  # noqa: E402


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("latent_norm")
    vae = save_kl_f16c32(root / "vae")
    out = root / "shards"
    assert main(["extract", "--data-path", write_images(root / "images"), "--vae", vae, "--image-size", "64",
                 "--out", str(out), "--workers", "0", "--no-progress"]) == 0
    return out


def _config(tmp_path, data_path, **data):
    cfg = tiny_config(tmp_path / "run", data={"path": str(data_path), **data},
                      train={"global_batch_size": 4, "max_steps": 2})
    for key in ("input_size", "in_channels", "num_classes"):  # the data decides them
        del cfg["model"][key]
    return cfg


def test_train_sample_decode_round_trip_uses_the_stats(shards, tmp_path, monkeypatch):
    import importlib

    from diffusers import AutoencoderKL

    from dit_trainer.train import DiTTrainer

    sample_decode = importlib.import_module("dit_trainer.sample.decode")  # the package exports a function of that name

    m = read_manifest(shards)
    trainer = DiTTrainer(_config(tmp_path, shards))
    assert (trainer.model.in_channels, trainer.model.input_size) == (32, 4)
    assert trainer.cfg.data.latent_mean == m["latent_mean"] and trainer.cfg.data.latent_std == m["latent_std"]
    # The model sees (z - mean) / std per channel.
    z = torch.randn(4, 32, 4, 4)
    x = trainer._prepare((z, torch.zeros(4, dtype=torch.long)))[0]
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (m["latent_mean"], m["latent_std"]))
    torch.testing.assert_close(x, (z - mean) / std)
    trainer.train()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]
    assert saved["latent_mean"] == m["latent_mean"] and saved["latent_std"] == m["latent_std"]

    seen = {}
    plain_decode, vae_decode = sample_decode.decode, AutoencoderKL.decode

    def model_samples(samples, *args, **kwargs):
        seen["samples"] = samples.detach().clone()
        return plain_decode(samples, *args, **kwargs)

    def vae_input(self, z, *args, **kwargs):
        seen["vae"] = z.detach().clone()
        return vae_decode(self, z, *args, **kwargs)

    monkeypatch.setattr(sample_decode, "decode", model_samples)
    monkeypatch.setattr(AutoencoderKL, "decode", vae_input)
    out = tmp_path / "grid.png"
    assert main(["sample", "--ckpt", str(tmp_path / "run"), "--class-labels", "0", "1", "--steps", "2",
                 "--sampler", "ddim", "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    assert out.is_file() and seen["samples"].shape == (2, 32, 4, 4)
    # The VAE decodes (z · std + mean) / scaling_factor: the stats undone, then the VAE's own scale.
    want = (seen["samples"] * std + mean) / m["scaling_factor"]
    torch.testing.assert_close(seen["vae"], want, rtol=1e-5, atol=1e-5)


def test_latents_without_stats_are_refused_in_one_line(shards, tmp_path, capsys):
    """Shards of a 32-channel VAE whose manifest has no statistics (an older extract, `dit data convert`)."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(shards, old)
    m = json.loads((old / MANIFEST).read_text())
    for key in ("latent_norm", "latent_mean", "latent_std"):
        del m[key]
    (old / MANIFEST).write_text(json.dumps(m))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_config(tmp_path, old)))
    assert main(["train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "32-channel latents" in err and "but no per-channel statistics" in err
    assert "re-run `dit extract`" in err and "data.latent_mean and data.latent_std (32 numbers each)" in err
    assert not (tmp_path / "run" / "checkpoints").exists()
    # Statistics set by hand are accepted instead; scale trains on the latents as stored.
    stats = ["--data.latent_mean", json.dumps([0.0] * 32), "--data.latent_std", json.dumps([2.0] * 32)]
    assert main(["train", "--config", str(cfg), *stats]) == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]
    assert saved["latent_std"] == [2.0] * 32
