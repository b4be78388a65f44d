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
