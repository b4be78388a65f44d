"""The clean images REPA's encoder reads beside the latents: `dit extract --keep-images` shards, and
an image folder trained through its latent cache (before and after the cache is complete)."""

import json

import numpy as np
import pytest
import torch
from tests.repa._tiny import TINY_REPA

from dit_trainer.cli import main
from dit_trainer.data.images import load_image
from dit_trainer.data.shards import LatentShards, epoch_draws
from dit_trainer.errors import DataError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics

pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def folder(tiny_latent_shards):
    shards, vae = tiny_latent_shards
    return shards.parent / "images", vae, shards


def _extract(images, vae, out, *flags):
    assert main(["extract", "--data-path", str(images), "--vae", str(vae), "--image-size", "16", "--out", str(out),
                 "--batch-size", "4", "--workers", "0", "--no-progress", *flags]) == 0
    return out


def _run(out, data, steps=2, **data_keys):
    return {"output_dir": str(out), "model": {"name": "SiT-S/2", "depth": 2, "hidden_size": 32, "num_heads": 2},
            "data": {"path": str(data), "num_workers": 0, **data_keys},
            "train": {"global_batch_size": 4, "max_steps": steps, "device": "cpu", "mixed_precision": "fp32"},
            "checkpoint": {"save_steps": 1000}, "logging": {"log_steps": 1, "progress": False, "tensorboard": False},
            "repa": dict(TINY_REPA)}


def test_kept_images_are_the_encoded_crops_flipped_with_their_latents(folder, tmp_path):
    images, vae, _ = folder
    out = _extract(images, vae, tmp_path / "shards", "--keep-images")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["images"] == [16, 16, 3]
    assert main(["data", "verify", str(out)]) == 0  # the image files are the shards' own, not strays
    ds = LatentShards(out, random_flip=True, seed=3)
    assert ds.stored_images and not ds.return_images
    assert isinstance(ds[0], tuple)  # off unless REPA asks: the release's items
    ds.return_images = True
    ds.set_epoch(1)
    index = list(range(len(ds)))
    items = ds.__getitems__(index)
    flips, _ = epoch_draws(3, 1, np.asarray(index), True, True)
    assert flips.any() and not flips.all()
    paths = sorted(p for p in images.rglob("*.png"))  # class folders c0, c1 in order, files sorted
    for i, item in enumerate(items):
        crop = torch.from_numpy(np.array(load_image(str(paths[i]), 16))).permute(2, 0, 1)
        assert item["image"].dtype == torch.uint8
        assert torch.equal(item["image"], crop.flip(-1) if flips[i] else crop), i
        assert torch.equal(item["x"], ds.__getitems__([i])[0]["x"])


def test_a_changed_kept_image_is_caught_by_verify_and_before_a_step(folder, tmp_path, capsys):
    images, vae, _ = folder
    out = _extract(images, vae, tmp_path / "shards", "--keep-images")
    entry = json.loads((out / "manifest.json").read_text())["shards"][0]
    kept = out / f"{entry['name']}.images.npy"
    assert entry["images_bytes"] == kept.stat().st_size and len(entry["images_sha256"]) == 64
    data = bytearray(kept.read_bytes())
    data[-1] ^= 0xFF  # same size, so only the checksum can tell
    kept.write_bytes(bytes(data))
    assert main(["data", "verify", str(out)]) == 1
    said = capsys.readouterr()
    assert kept.name in said.out + said.err and "does not match the sha256" in said.err
    with pytest.raises(DataError, match="does not match the sha256") as err:
        LatentShards(out)
    assert kept.name in str(err.value) and "\n" not in str(err.value)


def test_repa_trains_on_kept_images_and_refuses_shards_without_them(folder, tmp_path):
    images, vae, plain = folder
    out = _extract(images, vae, tmp_path / "shards", "--keep-images")
    DiTTrainer(_run(tmp_path / "run", out)).train()
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "repa_loss" in r] == [1, 2]
    with pytest.raises(DataError) as err:
        DiTTrainer(_run(tmp_path / "plain", plain)).train()
    assert "--keep-images" in str(err.value) and "\n" not in str(err.value)


def test_repa_trains_on_an_image_folder_through_its_latent_cache(folder, tmp_path):
    images, vae, _ = folder
    # 9 images, batches of 4: step 3 starts the second epoch, read from the completed cache.
    cfg = _run(tmp_path / "run", images, steps=4, vae=str(vae), image_size=16, cache_dir=str(tmp_path / "cache"))
    trainer = DiTTrainer(cfg)
    seen = []
    forward = trainer.alignment.targets.__call__

    def spy(batch_images):
        seen.append(batch_images.clone())
        return forward(batch_images)

    trainer.alignment.targets = spy
    trainer.train()
    assert len(seen) == 4 and all(s.shape == (4, 3, 16, 16) for s in seen)
    assert all(0.0 <= float(s.min()) and float(s.max()) <= 1.0 for s in seen)
    assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == 4
