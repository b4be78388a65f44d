"""`dit eval --ref-from-latents`: dit extract's shards -> their VAE -> images -> reference statistics."""

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("scipy")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.evaluate.features import extract_features  # noqa: E402
from dit_trainer.evaluate.stats import gaussian_stats  # noqa: E402


@pytest.fixture
def shards(tiny_latent_shards):
    return tiny_latent_shards


def _decoded_by_hand(folder, vae_dir):
    """The posterior means of every shard row, unflipped, through the VAE, as uint8 N×H×W×3."""
    from dit_trainer.data.shards import read_manifest
    from dit_trainer.vae.autoencoder import decode, load_vae

    m = read_manifest(folder)
    rows = np.concatenate([np.load(folder / f"{s['name']}.npy") for s in m["shards"]])
    means = torch.from_numpy(rows[:, 0, 0].astype(np.float32))  # variant 0: unflipped; kind 0: the mean
    images = decode(load_vae(str(vae_dir)), means, m["scaling_factor"], m.get("shift_factor"))
    return ((images + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def test_ref_from_latents_measures_the_vae_reconstructions(shards, tmp_path, capsys):
    from dit_trainer.evaluate.digits_net import load_digit_net

    folder, vae = shards
    out = tmp_path / "ref.npz"
    assert main(["eval", "--ref-from-latents", str(folder), "--out", str(out), "--network", "digits",
                 "--device", "cpu", "--no-progress", "--pr-features", "5"]) == 0
    assert "5 pool features" in capsys.readouterr().out
    feats = extract_features(load_digit_net(), _decoded_by_hand(folder, vae), progress=False)
    with np.load(out) as z:
        assert str(z["network"]) == "digits" and z["features"].shape == (5, 64)
        mu, sigma = gaussian_stats(feats.pool)
        np.testing.assert_allclose(z["mu"], mu, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(z["sigma"], sigma, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(z["mu_s"], gaussian_stats(feats.spatial)[0], rtol=1e-5, atol=1e-5)
    # Samples equal to those reconstructions score FID ~0 against it.
    np.savez(tmp_path / "same.npz", arr_0=_decoded_by_hand(folder, vae))
    assert main(["eval", "--network", "digits", "--samples", str(tmp_path / "same.npz"), "--ref", str(out),
                 "--device", "cpu", "--no-progress", "--json", str(tmp_path / "m.json")]) == 0
    import json

    m = json.loads((tmp_path / "m.json").read_text())
    assert abs(m["fid"]) < 1e-2


def test_ref_from_latents_errors_are_one_line(shards, tmp_path, capsys):
    folder, _ = shards
    assert main(["eval", "--ref-from-latents", str(folder), "--network", "digits"]) == 2
    assert "--ref-from-latents needs --out" in capsys.readouterr().err
    assert main(["eval", "--ref-from-latents", str(folder), "--ref-from-images", str(folder), "--out", "x.npz"]) == 2
    assert "one of --ref-from-images and --ref-from-latents" in capsys.readouterr().err
    # A .npy folder of 4-channel latents records no VAE.
    (tmp_path / "npy").mkdir()
    for i in range(3):
        np.save(tmp_path / "npy" / f"{i}.npy", np.zeros((4, 2, 2), np.float32))
    assert main(["eval", "--ref-from-latents", str(tmp_path / "npy"), "--out", str(tmp_path / "r.npz"),
                 "--network", "digits", "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--vae" in err and "\n" not in err
