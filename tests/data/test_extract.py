"""`dit extract` with a tiny random AutoencoderKL loaded through from_pretrained."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("diffusers")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.data import shards as sh  # noqa: E402
from dit_trainer.data.extract import run_extract  # noqa: E402
from dit_trainer.data.images import load_image, to_model_range  # noqa: E402
from dit_trainer.data.shards import LatentShards, read_manifest  # noqa: E402
from dit_trainer.data.tools import verify  # noqa: E402
from dit_trainer.vae.autoencoder import decode, encode, load_vae  # noqa: E402
from dit_trainer.errors import DataError  # noqa: E402

SIZE = 16
# Small shards and batches so several shards, a partial batch and a partial shard all occur.
SETTINGS = dict(image_size=SIZE, batch_size=2, shard_size=3, workers=0, progress=False)


def save_tiny_vae(folder):
    """A random 2-level AutoencoderKL (8× smaller channels than SD's), saved with save_pretrained."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                        norm_num_groups=8, sample_size=32)
    vae.save_pretrained(folder)
    return str(folder)


def write_images(root):
    """Two classes of images in several modes and sizes, plus one corrupt file."""
    rng = np.random.default_rng(0)
    specs = {"cat": [("a.png", (20, 30, 3), None), ("b.jpg", (40, 17), "L"), ("c.png", (16, 16, 4), "RGBA")],
             "dog": [("d.jpg", (50, 35, 4), "CMYK"), ("e.png", (33, 64, 3), None), ("f.bmp", (18, 24, 3), None),
                     ("g.png", (70, 40, 2), "LA")]}
    for cls, files in specs.items():
        (root / cls).mkdir(parents=True)
        for name, shape, mode in files:
            arr = rng.integers(0, 256, shape, dtype=np.uint8)
            (Image.fromarray(arr, mode) if mode else Image.fromarray(arr)).save(root / cls / name)
    (root / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 this is not a jpeg")
    return str(root)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("extract")
    vae = save_tiny_vae(root / "vae")
    images = write_images(root / "images")
    out = root / "reference"
    assert main(["extract", "--data-path", images, "--vae", vae, "--image-size", str(SIZE), "--out", str(out),
                 "--batch-size", "2", "--shard-size", "3", "--workers", "0", "--no-progress"]) == 0
    return {"vae": vae, "images": images, "reference": out}


def _arrays(root):
    m = read_manifest(root)
    names = [s["name"] for s in m["shards"]]
    return (np.concatenate([np.load(os.path.join(root, f"{n}.npy")) for n in names]),
            np.concatenate([np.load(os.path.join(root, f"{n}.labels.npy")) for n in names]))


def test_extract_writes_manifest_shards_and_skip_report(assets):
    out = assets["reference"]
    m = read_manifest(out)
    assert m["count"] == 7 and m["latent_shape"] == [4, 8, 8] and m["dtype"] == "float16"
    assert m["class_names"] == ["cat", "dog"] and m["num_classes"] == 2
    assert m["vae"] == assets["vae"] and m["scaling_factor"] == pytest.approx(0.18215)
    assert m["image_size"] == SIZE and m["flips"] is True and m["posterior"] == "mean_std"
    assert m["source"] == os.path.abspath(assets["images"])
    assert [s["count"] for s in m["shards"]] == [3, 2, 2] and m["skipped"] == 1
    assert (out / "skipped.txt").read_text().startswith(os.path.join("dog", "broken.jpg") + "\t")
    assert verify(out) == []
    data, labels = _arrays(out)
    assert data.shape == (7, 2, 2, 4, 8, 8) and labels.tolist() == [0, 0, 0, 1, 1, 1, 1]


def test_a_shard_of_only_unreadable_images_is_not_listed(assets, tmp_path):
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(images / f"{i}.png")
    for name in ("x.png", "y.png"):  # sorted last: the whole second shard
        (images / name).write_bytes(b"not a png")
    out = tmp_path / "out"
    run_extract(tmp_path / "images", assets["vae"], out=out, **SETTINGS)
    m = read_manifest(out)
    assert [(s["name"], s["count"]) for s in m["shards"]] == [("shard-00000", 3)] and m["count"] == 3
    assert m["skipped"] == 2 and m["shards"][0]["bytes"] == os.path.getsize(out / "shard-00000.npy")
    assert verify(out) == [] and not (out / "shard-00001.npy").exists()
    assert len(LatentShards(out)) == 3 and len((out / "skipped.txt").read_text().splitlines()) == 2
    # A folder an earlier version left with a zero-row shard is put right by re-running the command.
    sh._atomic_npy(str(out / "shard-00001.npy"), np.zeros((0, 2, 2, 4, 8, 8), np.float16))
    sh._atomic_npy(str(out / "shard-00001.labels.npy"), np.zeros(0, np.int64))
    run_extract(tmp_path / "images", assets["vae"], out=out, **SETTINGS)
    assert verify(out) == [] and not (out / "shard-00001.npy").exists()


def test_stored_latents_are_scaled_posteriors_of_both_flips(assets):
    data, _ = _arrays(assets["reference"])
    vae = load_vae(assets["vae"])
    # Sorted listing: dog/broken.jpg (skipped) precedes dog/d.jpg, so row 3 is d.jpg.
    x = torch.from_numpy(to_model_range(load_image(os.path.join(assets["images"], "dog", "d.jpg"), SIZE)[None]))
    posterior = vae.encode(x).latent_dist
    mean, std = encode(vae, torch.cat([x, x.flip(-1)]))
    torch.testing.assert_close(mean[:1], posterior.mean * 0.18215)
    for flip in range(2):
        np.testing.assert_allclose(data[3, flip, 0], mean[flip].numpy(), rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(data[3, flip, 1], std[flip].numpy(), rtol=2e-3, atol=1e-5)
    images = decode(vae, mean)
    assert images.shape == (2, 3, SIZE, SIZE) and images.abs().max() <= 1


def test_dataset_draws_fresh_posterior_samples(assets):
    ds = LatentShards(assets["reference"], seed=0)
    x0 = ds[0][0]
    ds.set_epoch(1)
    assert x0.shape == (4, 8, 8) and not torch.equal(x0, ds[0][0])


def test_sample_mode_without_flips_in_bf16(assets, tmp_path):
    run_extract(assets["images"], assets["vae"], out=tmp_path, posterior="sample", flips=False,
                vae_dtype="bf16", dtype="float32", **{**SETTINGS, "shard_size": 10})
    m = read_manifest(tmp_path)
    assert m["posterior"] == "sample" and m["flips"] is False and m["dtype"] == "float32"
    data, _ = _arrays(tmp_path)
    ref, _ = _arrays(assets["reference"])
    assert data.shape == (7, 1, 1, 4, 8, 8) and np.isfinite(data).all()
    # A sample sits within a few posterior stds of the mean (bf16 adds a little).
    assert np.abs(data[:, 0, 0] - ref[:, 0, 0]).max() < 6 * ref[:, 0, 1].max() + 0.05


def test_stop_on_bad_image_names_the_file(assets, tmp_path):
    with pytest.raises(DataError, match=r"broken\.jpg: UnidentifiedImageError"):
        run_extract(assets["images"], assets["vae"], out=tmp_path, on_bad_image="stop", **SETTINGS)


def test_resume_after_interrupt_gives_the_same_shards(assets, tmp_path, monkeypatch):
    real_close = sh.ShardWriter.close
    closed = []

    def close_then_die(self, **marker):
        result = real_close(self, **marker)
        closed.append(self.name)
        if len(closed) == 2:
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(sh.ShardWriter, "close", close_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_extract(assets["images"], assets["vae"], out=tmp_path, **SETTINGS)
    monkeypatch.setattr(sh.ShardWriter, "close", real_close)
    assert not (tmp_path / "manifest.json").exists() and sh.shard_done(str(tmp_path), "shard-00001")
    # A crash mid-write leaves temporary or marker-less files; they must be redone, not trusted.
    (tmp_path / "shard-00002.npy").write_bytes(b"partial")
    (tmp_path / "shard-00002.labels.npy.tmp123").write_bytes(b"partial")
    done = {n: os.stat(tmp_path / f"{n}.npy").st_mtime_ns for n in ("shard-00000", "shard-00001")}
    stats = run_extract(assets["images"], assets["vae"], out=tmp_path, **SETTINGS)
    assert stats["shards"] == 1 and stats["images"] == 2
    assert {n: os.stat(tmp_path / f"{n}.npy").st_mtime_ns for n in done} == done
    for got, want in zip(_arrays(tmp_path), _arrays(assets["reference"])):
        np.testing.assert_array_equal(got, want)
    assert verify(tmp_path) == [] and not list(tmp_path.glob("*.tmp*"))


def test_resume_with_other_settings_is_refused(assets, tmp_path):
    run_extract(assets["images"], assets["vae"], out=tmp_path, **SETTINGS)
    with pytest.raises(DataError, match="shard_size=3, this run has 4"):
        run_extract(assets["images"], assets["vae"], out=tmp_path, **{**SETTINGS, "shard_size": 4})


def test_offline_uncached_vae_id_is_one_line_error(assets, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "dit_trainer", "extract", "--data-path", assets["images"],
                           "--vae", "stabilityai/sd-vae-ft-mse", "--image-size", "16", "--out", str(tmp_path / "o"),
                           "--workers", "0", "--no-progress"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dit extract: error")]
    assert len(lines) == 1 and "pass a local folder" in lines[0] and "stabilityai/sd-vae-ft-mse" in lines[0]
    assert "Traceback" not in proc.stderr


def test_vae_errors(monkeypatch, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_vae(str(tmp_path / "missing" / "vae"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no config.json"):
        load_vae(str(tmp_path / "empty"))
    with pytest.raises(DataError, match="fp32 or bf16"):
        load_vae(str(tmp_path / "empty"), dtype="fp16")
    monkeypatch.setitem(sys.modules, "diffusers", None)
    with pytest.raises(DataError, match=r"pip install dit-trainer\[vae\]"):
        load_vae("stabilityai/sd-vae-ft-mse")


def test_pipeline_folder_with_vae_subfolder_loads(assets, tmp_path):
    import shutil

    shutil.copytree(assets["vae"], tmp_path / "pipe" / "vae")
    vae = load_vae(str(tmp_path / "pipe"), dtype="bf16")
    assert vae.dtype == torch.bfloat16 and not vae.training
    assert not any(p.requires_grad for p in vae.parameters())


def _train_config(out, data, max_steps):
    from dit_trainer.config import build_config

    return build_config({
        "output_dir": str(out),
        "model": {"name": "DiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 2, "depth": 1,
                  "hidden_size": 32, "num_heads": 2},
        "data": {"path": str(data), "num_workers": 0},
        "train": {"max_steps": max_steps, "global_batch_size": 4, "mixed_precision": "fp32", "device": "cpu",
                  "seed": 0},
        "checkpoint": {"save_steps": 3, "save_total_limit": 0},
        "logging": {"log_steps": 1, "tensorboard": False, "progress": False},
    })


def _losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_extract_then_train_five_steps_and_resume(assets, tmp_path):
    train = pytest.importorskip("dit_trainer.train")
    # 7 latents, global batch 4: every step starts a new epoch, so flips and posterior noise change.
    straight = tmp_path / "straight"
    assert train.DiTTrainer(_train_config(straight, assets["reference"], 5)).train()["loss"] > 0
    losses = _losses(straight)
    assert sorted(losses) == [1, 2, 3, 4, 5] and all(np.isfinite(v) for v in losses.values())
    resumed = tmp_path / "resumed"
    train.DiTTrainer(_train_config(resumed, assets["reference"], 3)).train()
    train.DiTTrainer(_train_config(resumed, assets["reference"], 5)).train()
    assert _losses(resumed) == pytest.approx(losses, rel=1e-5, abs=1e-7)
