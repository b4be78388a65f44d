"""Which statistics a run takes from its data, and the engines that cannot apply them."""

import json

import pytest

from dit_trainer.config import build_config
from dit_trainer.data.latent_norm import fill_latent_stats, refuse_channel_norm
from dit_trainer.errors import ConfigError, DataError


class Latents:
    """Stands in for a dataset: its shape and manifest are all that is read."""

    def __init__(self, channels, **manifest):
        self.latent_shape = (channels, 4, 4)
        self.manifest = manifest


def _fill(dataset, *overrides):
    cfg = build_config(None, ["--data.path", "somewhere", *overrides])
    given = frozenset(k.lstrip("-") for k in overrides[::2])
    fill_latent_stats(cfg, given, dataset, "somewhere/manifest.json")
    return cfg.data


def test_what_the_manifest_records_decides():
    stats = {"latent_mean": [0.5] * 32, "latent_std": [2.0] * 32}
    data = _fill(Latents(32, vae="v", latent_norm="channel", **stats))
    assert (data.latent_mean, data.latent_std) == ([0.5] * 32, [2.0] * 32)
    # The SD VAE's shards record scale: nothing is filled, the run keeps the release's inputs.
    assert _fill(Latents(4, vae="sd", latent_norm="scale", latent_mean=[0.1] * 4, latent_std=[1.0] * 4)).latent_mean is None
    # ...unless channel is asked for.
    assert _fill(Latents(4, vae="sd", latent_norm="scale", latent_mean=[0.1] * 4, latent_std=[1.0] * 4),
                 "--data.latent_norm", "channel").latent_mean == [0.1] * 4
    assert _fill(Latents(32, vae="v", latent_norm="channel", **stats), "--data.latent_norm", "scale").latent_mean is None
    # Latents of no named VAE (a .npy folder of anything) are used as stored.
    assert _fill(Latents(3)).latent_mean is None


def test_statistics_set_by_hand_win_and_must_fit():
    data = _fill(Latents(2, vae="v", latent_norm="channel", latent_mean=[9.0, 9.0], latent_std=[9.0, 9.0]),
                 "--data.latent_mean", "[0, 1]", "--data.latent_std", "[1, 2]")
    assert data.latent_mean == [0.0, 1.0]
    with pytest.raises(ConfigError, match=r"data.latent_mean lists 3 numbers but somewhere/manifest.json holds 2-channel"):
        _fill(Latents(2, vae="v"), "--data.latent_mean", "[0, 1, 2]", "--data.latent_std", "[1, 2, 3]")


def test_named_vae_without_statistics_is_refused():
    with pytest.raises(DataError, match=r"holds 16-channel latents of flux/vae but no per-channel statistics"):
        _fill(Latents(16, vae="flux/vae"))
    with pytest.raises(DataError, match=r"data.latent_norm channel needs them"):
        _fill(Latents(4, vae="sd"), "--data.latent_norm", "channel")


def test_engines_that_feed_latents_as_stored_refuse_statistics(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"latent_norm": "channel"}))
    cfg = build_config(None, ["--data.path", str(tmp_path)])
    with pytest.raises(ConfigError, match=r"backend mindspore trains on latents as stored, but .*manifest.json asks"):
        refuse_channel_norm(cfg, "backend mindspore")
    refuse_channel_norm(build_config(None, ["--data.path", str(tmp_path), "--data.latent_norm", "scale"]), "x")
    (tmp_path / "manifest.json").write_text(json.dumps({"latent_norm": "scale"}))
    refuse_channel_norm(cfg, "backend mindspore")
    with pytest.raises(ConfigError, match=r"data.latent_mean/std asks"):
        refuse_channel_norm(build_config(None, ["--data.path", str(tmp_path), "--data.latent_mean", "[0]",
                                                "--data.latent_std", "[1]"]), "backend mindspore")
