"""load_vae with a Hub id: cache first, then one quick reachability check; never contacts the Hub."""

import pytest
import torch

pytest.importorskip("diffusers")
import huggingface_hub  # noqa: E402

from dit_trainer.vae import autoencoder as vae_mod  # noqa: E402
from dit_trainer.errors import DataError  # noqa: E402


class AutoencoderKL(torch.nn.Module):
    """Stands in for diffusers' class; `cached` says whether the id is in the local cache."""

    cached = False
    calls = []

    @classmethod
    def from_pretrained(cls, name, local_files_only=False, **kwargs):
        cls.calls.append(local_files_only)
        if local_files_only and not cls.cached:
            raise OSError(f"{name} does not appear to have a file named config.json.")
        return cls()


@pytest.fixture
def fake_vae(monkeypatch):
    AutoencoderKL.calls = []
    AutoencoderKL.cached = False
    monkeypatch.setattr(vae_mod, "_autoencoder_class", lambda: AutoencoderKL)
    return AutoencoderKL


def test_uncached_id_offline_fails_at_once_in_one_line(fake_vae, offline_hub):
    with pytest.raises(DataError) as err:
        vae_mod.load_vae("org/some-vae")
    msg = str(err.value)
    assert "\n" not in msg and "'org/some-vae' is not in the Hugging Face cache" in msg
    assert "cannot be downloaded ([Errno -2] Name or service not known)" in msg and "HF_HOME" in msg
    # Only the cache was tried, and one short probe, not the retrying download.
    assert fake_vae.calls == [True] and offline_hub == [vae_mod.HUB_PROBE_TIMEOUT_S]


def test_cached_id_loads_without_touching_the_network(fake_vae, monkeypatch):
    fake_vae.cached = True
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda *a, **k: pytest.fail("network used"))
    vae = vae_mod.load_vae("org/some-vae")
    assert isinstance(vae, AutoencoderKL) and fake_vae.calls == [True]


def test_uncached_id_downloads_when_the_hub_answers(fake_vae, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda *a, **k: object())
    vae_mod.load_vae("org/some-vae")
    assert fake_vae.calls == [True, False]


def test_folder_class_comes_from_its_config(tmp_path):
    """AutoencoderDC loads by its config's _class_name; its factor and channels come from that config;
    another class is refused in one line before any weights load."""
    import json

    from tests.vae.autoencoders import save_dc

    vae = vae_mod.load_vae(save_dc(tmp_path / "dc"))
    assert type(vae).__name__ == "AutoencoderDC" and not vae_mod.has_posterior(vae)
    assert vae_mod.downsampling(vae) == 32 and vae_mod.latent_shape(vae, 64) == (32, 2, 2)
    mean, std = vae_mod.encode(vae, torch.zeros(1, 3, 64, 64))
    assert mean.shape == (1, 32, 2, 2) and torch.equal(std, torch.zeros_like(std))
    assert vae_mod.decode(vae, mean).shape == (1, 3, 64, 64)
    with pytest.raises(DataError, match=r"not a multiple of the VAE's downsampling factor 32"):
        vae_mod.latent_shape(vae, 48)
    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    with pytest.raises(DataError) as err:
        vae_mod.load_vae(tmp_path / "unet")
    assert "holds a UNet2DModel, not an AutoencoderKL or AutoencoderDC" in str(err.value) and "\n" not in str(err.value)


def test_cached_hub_id_uses_the_class_its_config_names(monkeypatch, tmp_path):
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"_class_name": "AutoencoderDC"}))
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, file: str(config))
    assert vae_mod._cached_class("org/dc-ae") == "AutoencoderDC"
    assert vae_mod._class_named("AutoencoderDC", "org/dc-ae").__name__ == "AutoencoderDC"
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, file: None)
    assert vae_mod._cached_class("org/other") is None
