"""Two-process `dit extract` under torchrun: disjoint shards whose union is the one-process result."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from tests.train.trainer_helpers import save_tiny_vae

pytest.importorskip("diffusers")

from dit_trainer.data.extract import run_extract  # noqa: E402
from dit_trainer.data.shards import read_manifest  # noqa: E402
from dit_trainer.data.tools import verify  # noqa: E402

pytestmark = pytest.mark.distributed


def write_images(root, per_class=5):
    """Three classes of random RGB and grayscale images of varied sizes, plus one corrupt file."""
    rng = np.random.default_rng(1)
    for c in range(3):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            shape = (16 + 7 * i, 20 + 3 * c) + (() if i % 2 else (3,))
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(root / f"class{c}" / f"{i}.png")
    (root / "class1" / "zz_broken.png").write_bytes(b"\x89PNG broken")
    return str(root)


def test_two_ranks_write_disjoint_shards_equal_to_one_process(tmp_path):
    vae = save_tiny_vae(tmp_path / "vae")
    images = write_images(tmp_path / "images")
    args = ["--image-size", "16", "--batch-size", "2", "--shard-size", "3", "--workers", "0", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "dit_trainer", "extract", "--data-path", images, "--vae", vae, "--out", str(tmp_path / "two"), *args],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's ranks, so float reductions run in the same order
    try:
        run_extract(images, vae, 16, tmp_path / "one", batch_size=2, shard_size=3, workers=0, progress=False)
    finally:
        torch.set_num_threads(threads)

    two, one = read_manifest(tmp_path / "two"), read_manifest(tmp_path / "one")
    assert two["shards"] == one["shards"] and two["count"] == one["count"] == 15
    assert verify(tmp_path / "two") == []
    ranks = {}
    for s in two["shards"]:
        with open(tmp_path / "two" / f"{s['name']}.json") as f:
            ranks.setdefault(json.load(f)["rank"], []).append(s["name"])
    # 16 files in shards of 3: six shards, three per rank, contiguous.
    assert sorted(ranks) == [0, 1] and len(ranks[0]) == len(ranks[1]) == 3
    assert not set(ranks[0]) & set(ranks[1]) and max(ranks[0]) < min(ranks[1])
    for s in two["shards"]:
        for suffix in (".npy", ".labels.npy"):
            a = np.load(tmp_path / "two" / f"{s['name']}{suffix}")
            b = np.load(tmp_path / "one" / f"{s['name']}{suffix}")
            np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=1e-3, atol=1e-4)
    assert (tmp_path / "two" / "skipped.txt").read_text() == (tmp_path / "one" / "skipped.txt").read_text() != ""


def test_a_rank_whose_images_are_all_unreadable_lists_no_empty_shard(tmp_path):
    from dit_trainer.data.latents import open_latent_dataset

    vae = save_tiny_vae(tmp_path / "vae")
    (tmp_path / "images" / "a").mkdir(parents=True)
    for i in range(2):
        Image.fromarray(np.full((16, 16, 3), 90 * i, np.uint8)).save(tmp_path / "images" / "a" / f"{i}.png")
    (tmp_path / "images" / "a" / "zz_broken.png").write_bytes(b"\x89PNG broken")
    # Shards of 2: rank 0 encodes the two good images, rank 1 only the broken one.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "dit_trainer", "extract", "--data-path", str(tmp_path / "images"), "--vae", vae, "--out",
         str(tmp_path / "out"), "--image-size", "16", "--shard-size", "2", "--workers", "0", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_manifest(tmp_path / "out")
    # Each entry also carries the checksums a cache proves its shards by.
    assert [{k: s[k] for k in ("name", "count")} for s in m["shards"]] == [{"name": "shard-00000", "count": 2}]
    assert m["skipped"] == 1 and all(len(s["sha256"]) == 64 for s in m["shards"])
    assert verify(tmp_path / "out") == []
    assert len(open_latent_dataset(tmp_path / "out")) == 2  # what training opens
