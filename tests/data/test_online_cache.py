"""`dit train` on an image folder: the VAE encodes as batches need, a latent cache keeps it, and the
losses are those of `dit extract` + `dit train`, loss for loss."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.subprocess_env import subprocess_env
from tests.train.trainer_helpers import save_tiny_vae, tiny_config, write_images

pytest.importorskip("diffusers")

from dit_trainer.data.extract import run_extract  # noqa: E402
from dit_trainer.data.online import cache as lc  # noqa: E402
from dit_trainer.data.online import open_image_folder  # noqa: E402
from dit_trainer.data.online.encoder import encoder_for  # noqa: E402
from dit_trainer.data.tools import verify  # noqa: E402
from dit_trainer.errors import DataError  # noqa: E402
from dit_trainer.train import DiTTrainer  # noqa: E402

SIZE, STEPS, BATCH = 16, 8, 4  # 12 images: 3 batches an epoch, so 8 steps cross two epoch ends


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("online")
    vae, images = save_tiny_vae(root / "vae"), write_images(root / "images")
    run_extract(images, vae, SIZE, root / "shards", workers=0, progress=False)
    reference = losses(train_run(root / "reference", str(root / "shards")))
    return {"root": root, "vae": vae, "images": images, "shards": str(root / "shards"), "losses": reference}


def run_config(out, path, **data):
    cfg = tiny_config(out, data={"path": path, **data}, train={"global_batch_size": BATCH, "max_steps": STEPS},
                      checkpoint={"save_steps": 2})
    for key in ("input_size", "in_channels", "num_classes"):
        del cfg["model"][key]  # the data decides them, as a newcomer's run does
    return cfg


def train_run(out, path, **data):
    DiTTrainer(run_config(out, path, **data)).train()
    return out


def losses(out):
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [r["loss"] for r in rows if "loss" in r]  # a resume under torchrun adds a record without one


def online(assets, cache, **extra):
    return {"vae": assets["vae"], "image_size": SIZE, "cache_dir": str(cache), **extra}


def cache_dir_of(cache):
    (folder,) = glob.glob(os.path.join(cache, "images-*"))
    return folder


def assert_cache_is_extracts(assets, folder):
    assert verify(folder) == []
    for name in ("shard-00000.npy", "shard-00000.labels.npy"):
        assert np.array_equal(np.load(os.path.join(folder, name)), np.load(os.path.join(assets["shards"], name)))
    assert not os.path.isdir(os.path.join(folder, lc.PIECES))


def test_image_folder_trains_loss_for_loss_like_extract_then_reads_its_cache(assets, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    first = losses(train_run(tmp_path / "first", assets["images"], **online(assets, cache, num_workers=2)))
    assert first == assets["losses"] and len(first) == STEPS
    folder = cache_dir_of(cache)
    assert_cache_is_extracts(assets, folder)
    err = capsys.readouterr().err
    assert f"latent cache {folder}: new" in err and "is complete" in err
    saved = json.loads(json.dumps(__import__("yaml").safe_load((tmp_path / "first" / "config.yaml").read_text())))
    assert saved["data"]["vae"] == assets["vae"] and saved["model"]["input_size"] == 8
    assert saved["data"]["class_names"] == ["c0", "c1", "c2"]

    # Another run over the same folder and VAE reads the finished cache without loading the VAE.
    def no_vae(*args, **kwargs):
        raise AssertionError("the VAE was loaded for a complete cache")

    monkeypatch.setattr("dit_trainer.vae.autoencoder.load_vae", no_vae)
    assert losses(train_run(tmp_path / "second", assets["images"], **online(assets, cache))) == assets["losses"]
    assert "complete, read as shards" in capsys.readouterr().err


def test_resume_in_the_first_epoch_reads_what_was_encoded(assets, tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "run"
    cfg = run_config(out, assets["images"], **online(assets, cache))
    cfg["train"]["max_steps"] = 2
    DiTTrainer(cfg).train()
    folder = cache_dir_of(cache)
    where = lc.scan(folder, 12, (2, 2, 4, 8, 8))
    assert where.covered == 2 * BATCH and not os.path.isfile(os.path.join(folder, "manifest.json"))
    cfg["train"]["max_steps"] = STEPS
    DiTTrainer(cfg).train()
    assert losses(out) == assets["losses"]
    assert_cache_is_extracts(assets, folder)


KILLER = """
import os, signal, sys
from dit_trainer.data import shards as sh
from dit_trainer.data.online import cache as lc
from dit_trainer.train import DiTTrainer
import tests.data.test_online_cache as t

lc.PIECE_ROWS = 2
write = sh._atomic_npy
count = [0]

def dying_write(path, array):
    # The third piece's rows: half a temporary file, then kill -9.
    if path.endswith(".rows.npy"):
        count[0] += 1
        if count[0] == 3:
            with open(path + ".tmp" + str(os.getpid()), "wb") as f:
                f.write(b"\\x93NUMPY half a file")
            os.kill(os.getpid(), signal.SIGKILL)
    return write(path, array)

sh._atomic_npy = dying_write
DiTTrainer(t.run_config({out!r}, {images!r}, vae={vae!r}, image_size=t.SIZE, cache_dir={cache!r})).train()
"""


def test_a_cache_killed_mid_write_is_completed_not_corrupted(assets, tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "killed"
    script = KILLER.format(out=str(out), images=assets["images"], vae=assets["vae"], cache=str(cache))
    env = subprocess_env(OMP_NUM_THREADS="1")  # the script imports tests.data.test_online_cache
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    folder = cache_dir_of(cache)
    pieces = os.listdir(os.path.join(folder, lc.PIECES))
    # Killed writing the third piece: two whole pieces, a half temporary file and an index without rows.
    assert sum(".tmp" in n for n in pieces) == 1 and sum(n.endswith(".rows.npy") for n in pieces) == 2
    assert sum(n.endswith(".index.npy") for n in pieces) == 3
    assert lc.scan(folder, 12, (2, 2, 4, 8, 8)).covered == 2 * BATCH
    # Rerun: it resumes from the step-2 checkpoint, reads what the cache holds, completes it.
    train_run(out, assets["images"], **online(assets, cache))
    assert losses(out) == assets["losses"]
    assert_cache_is_extracts(assets, folder)


def test_changed_folder_size_or_vae_makes_a_new_cache_named_in_the_log(assets, tmp_path, capsys):
    images = tmp_path / "images"
    write_images(images, classes=2, per_class=2)
    first = open_image_folder(images, vae=assets["vae"], image_size=SIZE, device="cpu", cache_dir=tmp_path / "c")
    assert f"latent cache {first.root}: new" in capsys.readouterr().err
    again = open_image_folder(images, vae=assets["vae"], image_size=SIZE, device="cpu", cache_dir=tmp_path / "c")
    assert again.root == first.root and "0 of 4 images encoded" in capsys.readouterr().err
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(images / "c1" / "extra.png")
    changed = [open_image_folder(images, vae=assets["vae"], image_size=SIZE, device="cpu", cache_dir=tmp_path / "c"),
               open_image_folder(images, vae=assets["vae"], image_size=2 * SIZE, device="cpu", cache_dir=tmp_path / "c"),
               open_image_folder(images, vae=assets["vae"], image_size=SIZE, vae_dtype="bf16", device="cpu",
                                 cache_dir=tmp_path / "c")]
    roots = {first.root, *(d.root for d in changed)}
    assert len(roots) == 4
    err = capsys.readouterr().err
    for d in changed:
        assert f"latent cache {d.root}: new" in err
    assert "differ from those of images-16px-" in err and len(changed[0]) == 5


def test_unreadable_image_stops_with_one_line_naming_it(assets, tmp_path):
    images = tmp_path / "images"
    write_images(images, classes=1, per_class=2)
    (images / "c0" / "broken.png").write_bytes(b"\x89PNG not really")
    dataset = open_image_folder(images, vae=assets["vae"], image_size=SIZE, device="cpu", cache_dir=tmp_path / "c")
    stage = encoder_for(dataset, "cpu", progress=False)
    ds, collate, finish = stage.start_epoch(0)
    broken = dataset.paths.index(str(images / "c0" / "broken.png"))
    with pytest.raises(DataError, match=r"broken.png: .*remove or replace it") as err:
        finish(collate(ds.__getitems__([0, broken])))
    assert "\n" not in str(err.value)


def test_default_vae_offline_is_one_line(tmp_path):
    images = write_images(tmp_path / "images", classes=1, per_class=1)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "dit_trainer", "train", "--data.path", images, "--data.image_size", "16",
                           "--data.cache_dir", str(tmp_path / "c"), "--train.device", "cpu",
                           "--output_dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dit train: error")]
    assert len(lines) == 1 and "stabilityai/sd-vae-ft-mse" in lines[0] and "Traceback" not in proc.stderr


def _torchrun_train(tmp_path, name, path, steps, **data):
    import yaml

    cfg = run_config(tmp_path / name, path, **data)
    cfg["train"]["max_steps"] = steps
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "dit_trainer", "train", "--config", str(tmp_path / f"{name}.yaml")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / name


@pytest.mark.distributed
def test_two_ranks_encode_their_own_shares_and_match_extract(assets, tmp_path):
    cache = tmp_path / "cache"
    out = _torchrun_train(tmp_path, "online", assets["images"], 2, **online(assets, cache))
    folder = cache_dir_of(cache)
    pieces = os.path.join(folder, lc.PIECES)
    index = np.concatenate([np.load(os.path.join(pieces, n)) for n in os.listdir(pieces) if n.endswith(".index.npy")])
    # Two steps of the first epoch: 8 images, each encoded once, by the rank whose share it was.
    assert len(index) == len(set(index.tolist())) == 2 * BATCH
    _torchrun_train(tmp_path, "online", assets["images"], STEPS, **online(assets, cache))
    # Two ranks sum gradients in another order than one process, so equal to rounding; the cache's
    # bytes, what the exactness rests on, are extract's exactly.
    assert losses(out) == pytest.approx(assets["losses"], rel=1e-6) and len(losses(out)) == STEPS
    assert_cache_is_extracts(assets, folder)


def test_resume_after_the_folder_changed_is_refused_through_the_checkpoint(assets, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(assets["images"], images)
    cfg = run_config(tmp_path / "run", str(images), **online(assets, tmp_path / "cache"))
    cfg["train"]["max_steps"] = 2
    DiTTrainer(cfg).train()
    os.remove(images / "c0" / "0.png")
    cfg["train"]["max_steps"] = 4
    with pytest.raises(DataError, match="holds 11 images, the checkpoint's run read 12") as err:
        DiTTrainer(cfg).train()
    assert "--data.allow_changed true" in str(err.value)
    assert len(losses(tmp_path / "run")) == 2  # refused before a step
