"""`dit extract` with autoencoders beyond the SD VAE: per-channel statistics that make the latents
training reads zero-mean and unit-std per channel."""

import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.data.shards import LatentShards, read_manifest  # noqa: E402
from dit_trainer.vae.latent_stats import normalize  # noqa: E402
from tests.vae.autoencoders import save_dc, save_kl_f16c32, write_images  # noqa: E402


def _extract(tmp_path, vae, *flags):
    images = tmp_path / "images"
    images = str(images) if images.exists() else write_images(images)
    out = tmp_path / "shards"
    assert main(["extract", "--data-path", images, "--vae", vae, "--image-size", "64", "--out", str(out),
                 "--batch-size", "3", "--shard-size", "5", "--workers", "0", "--no-progress", *flags]) == 0
    return out, read_manifest(out)


def _epochs_of_latents(out, epochs):
    """What training reads over `epochs` epochs (random flips, posterior samples), normalised by the manifest."""
    ds = LatentShards(out, random_flip=True, sample_posterior=True, seed=0)
    stats = (ds.manifest["latent_mean"], ds.manifest["latent_std"])
    seen = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        seen.append(torch.stack([x for x, _ in ds.__getitems__(list(range(len(ds))))]))
    x = torch.cat(seen).double()
    return x, normalize(x, stats)


def _per_channel(x):
    return x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3))


@pytest.mark.parametrize("kind", ["dc", "kl_f16c32"])
def test_stats_make_the_training_latents_standard(tmp_path, kind):
    vae = (save_dc if kind == "dc" else save_kl_f16c32)(tmp_path / "vae")
    out, m = _extract(tmp_path, vae)
    side = 2 if kind == "dc" else 4
    assert m["latent_shape"] == [32, side, side] and m["latent_norm"] == "channel"
    # DC-AE has no posterior: one latent per image is stored, not a mean and a zero std.
    assert m["posterior"] == ("sample" if kind == "dc" else "mean_std")
    assert len(m["latent_mean"]) == len(m["latent_std"]) == 32
    # Exact: the stored values (both flips; mean² + std² for a posterior) give the recorded numbers.
    rows = np.concatenate([np.load(os.path.join(out, f"{s['name']}.npy")) for s in m["shards"]]).astype(np.float64)
    mean = rows[:, :, 0].mean(axis=(0, 1, 3, 4))
    second = (rows[:, :, 0] ** 2).mean(axis=(0, 1, 3, 4))
    if rows.shape[2] == 2:
        second = second + (rows[:, :, 1] ** 2).mean(axis=(0, 1, 3, 4))
    np.testing.assert_allclose(m["latent_mean"], mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(m["latent_std"], np.sqrt(second - mean ** 2), rtol=1e-7)
    # On what training reads (random flips, posterior noise): per channel mean ≈ 0 and std ≈ 1 once
    # normalised, which the raw latents of these random autoencoders are far from.
    raw, norm = _epochs_of_latents(out, epochs=40)
    raw_mean, raw_std = _per_channel(raw)
    assert (raw_mean.abs().max() > 0.2) or ((raw_std - 1).abs().max() > 0.2)
    got_mean, got_std = _per_channel(norm)
    assert got_mean.abs().max() < 0.08 and (got_std - 1).abs().max() < 0.08


def test_sd_vae_records_scale_and_keeps_its_shards(tmp_path):
    """The 4-channel KL VAE keeps its scaling_factor alone: training does not normalise its latents."""
    from tests.data.test_extract import save_tiny_vae

    out, m = _extract(tmp_path, save_tiny_vae(tmp_path / "vae"))
    assert m["latent_norm"] == "scale" and m["scaling_factor"] == pytest.approx(0.18215)
    assert m["latent_shape"] == [4, 32, 32] and m["posterior"] == "mean_std"
    marker = json.loads((out / f"{m['shards'][0]['name']}.json").read_text())
    assert marker["latent_sums"]["n"] == 5 * 2 * 32 * 32


def test_rerun_over_an_older_extract_adds_the_stats_without_encoding(tmp_path):
    """Shards whose markers have no sums (an extract of an older version): the same command again
    re-encodes nothing and writes the statistics, summed from the shard files."""
    out, m = _extract(tmp_path, save_kl_f16c32(tmp_path / "vae"))
    mtimes = {}
    for s in m["shards"]:
        path = out / f"{s['name']}.json"
        marker = json.loads(path.read_text())
        del marker["latent_sums"]
        path.write_text(json.dumps(marker))
        mtimes[s["name"]] = os.stat(out / f"{s['name']}.npy").st_mtime_ns
    old = {k: v for k, v in m.items() if k not in ("latent_norm", "latent_mean", "latent_std")}
    (out / "manifest.json").write_text(json.dumps(old))
    again = _extract(tmp_path, m["vae"])[1]
    assert {s["name"]: os.stat(out / f"{s['name']}.npy").st_mtime_ns for s in m["shards"]} == mtimes
    assert again["latent_norm"] == "channel"
    np.testing.assert_allclose(again["latent_mean"], m["latent_mean"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(again["latent_std"], m["latent_std"], rtol=1e-12)


@pytest.mark.distributed
def test_two_ranks_merge_to_the_one_process_statistics(tmp_path):
    """Each rank sums its own shards; rank 0 merges every marker in shard order, as one process does."""
    import subprocess
    import sys

    from dit_trainer.data.extract import run_extract
    from dit_trainer.vae.latent_stats import merge

    vae = save_kl_f16c32(tmp_path / "vae")
    images = write_images(tmp_path / "images", per_class=5)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "dit_trainer",
         "extract", "--data-path", images, "--vae", vae, "--out", str(tmp_path / "two"), "--image-size", "64",
         "--batch-size", "2", "--shard-size", "3", "--workers", "0", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's ranks
    try:
        run_extract(images, vae, 64, tmp_path / "one", batch_size=2, shard_size=3, workers=0, progress=False)
    finally:
        torch.set_num_threads(threads)
    two, one = read_manifest(tmp_path / "two"), read_manifest(tmp_path / "one")
    markers = [json.loads((tmp_path / "two" / f"{s['name']}.json").read_text()) for s in two["shards"]]
    assert {m["rank"] for m in markers} == {0, 1}
    assert merge(m["latent_sums"] for m in markers) == (two["latent_mean"], two["latent_std"])
    np.testing.assert_allclose(two["latent_mean"], one["latent_mean"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(two["latent_std"], one["latent_std"], rtol=1e-4)
