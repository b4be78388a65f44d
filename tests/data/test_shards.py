"""Packed shards: writer, manifest, LatentShards randomness and access, convert and verify."""

import json
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from dit_trainer.cli import main
from dit_trainer.data import shards as sh
from dit_trainer.data.shards import LatentShards, ShardWriter, read_manifest, write_manifest
from dit_trainer.data.tools import convert, verify
from dit_trainer.errors import DataError

SHAPE = (4, 8, 8)


def make_shards(root, counts=(5, 3, 4), flips=True, posterior="mean_std", dtype="float32", num_classes=3):
    """Random shards and their full array (N×F×K×C×H×W) and labels."""
    entry = (2 if flips else 1, 2 if posterior == "mean_std" else 1, *SHAPE)
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (sum(counts), *entry)).astype(dtype)
    if posterior == "mean_std":
        data[:, :, 1] = rng.uniform(0.1, 0.5, data[:, :, 1].shape)
    labels = rng.integers(0, num_classes, sum(counts))
    os.makedirs(root, exist_ok=True)
    shards, lo = [], 0
    for i, n in enumerate(counts):
        w = ShardWriter(str(root), sh.shard_name(i, len(counts)), n, entry, dtype)
        w.add(data[lo:lo + n], labels[lo:lo + n])
        shards.append(w.close())
        lo += n
    write_manifest(str(root), count=sum(counts), latent_shape=list(SHAPE), dtype=dtype, num_classes=num_classes,
                   class_names=[f"c{i}" for i in range(num_classes)], vae="some/vae", scaling_factor=0.18215,
                   image_size=64, flips=flips, posterior=posterior,
                   shards=[{"name": s["name"], "count": s["count"]} for s in shards])
    return data, labels


def test_items_shapes_labels_and_attributes(tmp_path):
    data, labels = make_shards(tmp_path)
    ds = LatentShards(tmp_path, random_flip=False, sample_posterior=False)
    assert len(ds) == 12 and ds.num_classes == 3 and ds.latent_shape == SHAPE
    assert ds.class_names == ["c0", "c1", "c2"]
    for i in (0, 4, 5, 11, -1):
        x, y = ds[i]
        assert x.dtype == torch.float32 and x.shape == SHAPE and y.dtype == torch.int64 and y.ndim == 0
        np.testing.assert_array_equal(x.numpy(), data[i, 0, 0])
        assert int(y) == labels[i]
    with pytest.raises(IndexError):
        ds[12]


def test_one_mmap_per_shard_not_per_sample(tmp_path, monkeypatch):
    make_shards(tmp_path)
    ds = LatentShards(tmp_path)
    calls = []
    real = sh.open_memmap
    monkeypatch.setattr(sh, "open_memmap", lambda path: calls.append(os.path.basename(path)) or real(path))
    for _ in range(3):
        for i in range(len(ds)):
            ds[i]
    assert sorted(calls) == ["shard-00000.npy", "shard-00001.npy", "shard-00002.npy"]


def test_randomness_is_a_function_of_seed_epoch_index(tmp_path):
    data, _ = make_shards(tmp_path)
    a, b = LatentShards(tmp_path, seed=3), LatentShards(tmp_path, seed=3)
    b[7]  # a history of other reads must not matter
    assert torch.equal(a[2][0], b[2][0])
    a.set_epoch(1)
    assert not torch.equal(a[2][0], b[2][0])
    b.set_epoch(1)
    assert torch.equal(a[2][0], b[2][0])
    assert not torch.equal(LatentShards(tmp_path, seed=4)[2][0], LatentShards(tmp_path, seed=3)[2][0])
    with pytest.raises(ValueError):
        a.set_epoch(-1)


def test_workers_and_distributed_ranks_see_the_same_items(tmp_path):
    make_shards(tmp_path)
    ds = LatentShards(tmp_path, seed=1)
    ds.set_epoch(2)
    direct = torch.stack([ds[i][0] for i in range(len(ds))])
    via_workers = torch.cat([x for x, _ in DataLoader(ds, batch_size=5, num_workers=2)])
    torch.testing.assert_close(via_workers, direct, rtol=0, atol=0)
    seen = {}
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(2)
        for i, (x, _) in zip(list(sampler), DataLoader(ds, batch_size=1, sampler=sampler)):
            seen.setdefault(i, x[0])
    assert set(seen) == set(range(len(ds)))
    for i, x in seen.items():
        assert torch.equal(x, direct[i])


def test_flip_picks_stored_mirror_and_posterior_noise_is_standard(tmp_path):
    data, _ = make_shards(tmp_path, counts=(200,))
    ds = LatentShards(tmp_path, random_flip=True, sample_posterior=False)
    flipped = [i for i in range(len(ds)) if torch.equal(ds[i][0], torch.from_numpy(data[i, 1, 0]))]
    assert 60 < len(flipped) < 140
    ds = LatentShards(tmp_path, random_flip=False, sample_posterior=True)
    eps = torch.stack([(ds[i][0] - torch.from_numpy(data[i, 0, 0])) / torch.from_numpy(data[i, 0, 1])
                       for i in range(len(ds))])
    assert abs(eps.mean()) < 0.02 and abs(eps.std() - 1) < 0.02


def test_mirrors_latent_when_flips_not_stored(tmp_path):
    data, _ = make_shards(tmp_path, counts=(50,), flips=False, posterior="sample")
    ds = LatentShards(tmp_path, random_flip=True)
    kinds = {torch.equal(ds[i][0], torch.from_numpy(data[i, 0, 0]).flip(-1)) for i in range(50)}
    assert kinds == {True, False}


def test_read_manifest_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="manifest.json does not exist"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{oops")
    with pytest.raises(DataError, match="not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": sh.FORMAT, "version": 1}))
    with pytest.raises(DataError, match="lacks count"):
        LatentShards(tmp_path)


def _edit_manifest(root, **changes):
    m = json.loads((root / "manifest.json").read_text())
    m.update(changes)
    (root / "manifest.json").write_text(json.dumps(m))


def test_verify_names_what_is_wrong(tmp_path):
    make_shards(tmp_path, dtype="float16")
    assert verify(tmp_path) == []
    assert main(["data", "verify", str(tmp_path), "--no-progress"]) == 0
    arr = np.load(tmp_path / "shard-00001.npy")
    arr[2, 0, 0, 1, 2, 3] = np.nan
    np.save(tmp_path / "shard-00001.npy", arr)
    np.save(tmp_path / "shard-00002.labels.npy", np.array([0, 1, 2, 7]))
    np.save(tmp_path / "shard-00009.npy", arr)
    problems = verify(tmp_path)
    assert any("shard-00001.npy: row 2 holds NaN" in p for p in problems)
    assert any("shard-00002.labels.npy" in p and "outside 0..2" in p for p in problems)
    assert any("shard-00009.npy: not listed" in p for p in problems)
    assert main(["data", "verify", str(tmp_path), "--no-progress"]) == 1
    _edit_manifest(tmp_path, count=99, dtype="int8")
    problems = verify(tmp_path)
    assert any("count is 99" in p for p in problems) and any("dtype='int8'" in p for p in problems)
    _edit_manifest(tmp_path, count=12, dtype="float32")
    assert any("dtype float16, manifest says float32" in p for p in verify(tmp_path))
    os.remove(tmp_path / "shard-00000.npy")
    _edit_manifest(tmp_path, dtype="float16")
    assert any("shard-00000.npy: cannot open" in p for p in verify(tmp_path))


def _npy_folder(root, n=7):
    rng = np.random.default_rng(5)
    latents = rng.standard_normal((n, *SHAPE)).astype(np.float32)
    root.mkdir(parents=True)
    for i in range(n):
        np.save(root / f"{i}.npy", latents[i][None])
    return latents


def test_convert_npy_folder_keeps_items(tmp_path):
    src = tmp_path / "npy"
    latents = _npy_folder(src)
    (src / "labels.json").write_text(json.dumps({"labels": {str(i): i % 2 for i in range(7)}, "class_names": ["a", "b"]}))
    m = convert(src, tmp_path / "out", shard_size=3, dtype="float32", vae="v", progress=False)
    assert m["count"] == 7 and len(m["shards"]) == 3 and m["posterior"] == "sample" and not m["flips"]
    assert verify(tmp_path / "out") == []
    ds = LatentShards(tmp_path / "out", random_flip=False)
    assert ds.class_names == ["a", "b"] and ds.num_classes == 2
    for i in range(7):
        np.testing.assert_array_equal(ds[i][0].numpy(), latents[i])
        assert int(ds[i][1]) == i % 2
    from dit_trainer.data.latents import open_latent_dataset
    assert isinstance(open_latent_dataset(tmp_path / "out"), LatentShards)
    with pytest.raises(DataError, match="already holds shards"):
        convert(src, tmp_path / "out", progress=False)


def test_convert_fastdit_features_via_cli(tmp_path):
    root = tmp_path / "features"
    (root / "imagenet256_features").mkdir(parents=True)
    (root / "imagenet256_labels").mkdir()
    for i in range(5):
        np.save(root / "imagenet256_features" / f"{i}.npy", np.full((1, *SHAPE), i, dtype=np.float32))
        np.save(root / "imagenet256_labels" / f"{i}.npy", np.array([i % 3]))
    out = tmp_path / "shards"
    assert main(["data", "convert", str(root), "--out", str(out), "--shard-size", "2", "--no-progress"]) == 0
    ds = LatentShards(out, random_flip=False)
    assert len(ds) == 5 and [int(ds[i][1]) for i in range(5)] == [0, 1, 2, 0, 1]
    assert float(ds[4][0].mean()) == 4.0
    assert read_manifest(out)["dtype"] == "float16"


def test_convert_refuses_a_npy_folder_without_labels_unless_unconditional(tmp_path, capsys):
    # As dit train does: packed into shards, the labels someone forgot would be lost without a word.
    src = tmp_path / "npy"
    _npy_folder(src, n=4)
    assert main(["data", "convert", str(src), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "has no labels file" in err and "--labels-file" in err and "--unconditional" in err
    assert not (tmp_path / "out").exists()
    assert main(["data", "convert", str(src), "--out", str(tmp_path / "out"), "--no-progress", "--unconditional"]) == 0
    assert read_manifest(tmp_path / "out")["num_classes"] == 1


def test_verify_reads_per_file_latents(tmp_path, capsys):
    src = tmp_path / "npy"
    _npy_folder(src, n=5)
    (src / "labels.json").write_text(json.dumps({"labels": {str(i): i % 3 for i in range(5)}}))
    assert main(["data", "verify", str(src), "--no-progress"]) == 0
    assert "ok: 5 per-file latents (4, 8, 8), 3 classes" in capsys.readouterr().out
    bad = np.zeros((1, 4, 8, 8), dtype=np.float32)
    bad[0, 0, 0, 0] = np.nan
    np.save(src / "3.npy", bad)
    assert main(["data", "verify", str(src), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "3.npy contains NaN" in err and len(err.strip().splitlines()) == 1
    (src / "labels.json").unlink()
    assert main(["data", "verify", str(src), "--no-progress"]) == 1
    assert "has no labels file" in capsys.readouterr().err
