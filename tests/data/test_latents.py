import json
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dit_trainer.data import FastDiTFeatures, NpyLatentFolder, open_latent_dataset
from dit_trainer.data.latents import flip_for
from dit_trainer.errors import DataError

SHAPE = (4, 2, 3)


def latent(i, shape=SHAPE, dtype=np.float32):
    return (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 100 * i).astype(dtype)


def make_folder(root, n=5, names=None, shape=SHAPE):
    root.mkdir(parents=True, exist_ok=True)
    names = names or [f"img{i}" for i in range(n)]
    for i, name in enumerate(names):
        np.save(root / f"{name}.npy", latent(i, shape))
    return names


def make_fastdit(root, labels, batch_dim=True, scalar_labels=False):
    (root / "imagenet256_features").mkdir(parents=True)
    (root / "imagenet256_labels").mkdir()
    for i, y in enumerate(labels):
        x = latent(i)
        np.save(root / "imagenet256_features" / f"{i}.npy", x[None] if batch_dim else x)
        np.save(root / "imagenet256_labels" / f"{i}.npy", np.array(y) if scalar_labels else np.array([y]))


def expect_error(fn, name):
    with pytest.raises(DataError) as info:
        fn()
    msg = str(info.value)
    assert name in msg and "\n" not in msg, msg
    return msg


def test_folder_without_labels(tmp_path):
    make_folder(tmp_path)
    np.save(tmp_path / "img5.npy", latent(5)[None].astype(np.float16))  # 1×C×H×W, half precision
    ds = NpyLatentFolder(tmp_path)
    assert len(ds) == 6 and ds.latent_shape == SHAPE and ds.num_classes == 1 and ds.class_names is None
    for i in range(6):
        x, y = ds[i]
        assert x.dtype == torch.float32 and tuple(x.shape) == SHAPE
        assert y.dtype == torch.int64 and y.ndim == 0 and int(y) == 0
        np.testing.assert_array_equal(x.numpy(), latent(i))
    assert torch.equal(ds[-1][0], ds[5][0])
    with pytest.raises(IndexError):
        ds[6]


def test_integer_names_sort_numerically_with_labels_npy(tmp_path):
    names = [str(i) for i in range(12)]
    make_folder(tmp_path, names=names)
    np.save(tmp_path / "labels.npy", np.arange(12) % 7)
    ds = NpyLatentFolder(tmp_path, num_classes=7)
    assert [os.path.basename(p) for p in ds.paths] == [f"{i}.npy" for i in range(12)]
    assert [int(ds[i][1]) for i in range(12)] == list(np.arange(12) % 7)
    assert ds.num_classes == 7


def test_labels_json_and_txt(tmp_path):
    names = make_folder(tmp_path / "a", n=4)
    (tmp_path / "a" / "labels.json").write_text(json.dumps({n: i + 1 for i, n in enumerate(names)}))
    ds = NpyLatentFolder(tmp_path / "a")
    assert [int(ds[i][1]) for i in range(4)] == [1, 2, 3, 4] and ds.num_classes == 5

    make_folder(tmp_path / "b", n=3)
    labels = {"labels": {"img0": 2, "img1": 0, "img2": 1}, "class_names": ["cat", "dog", "eel"]}
    (tmp_path / "b" / "labels.json").write_text(json.dumps(labels))
    ds = NpyLatentFolder(tmp_path / "b")
    assert ds.class_names == ["cat", "dog", "eel"] and ds.num_classes == 3
    assert [int(ds[i][1]) for i in range(3)] == [2, 0, 1]

    make_folder(tmp_path / "c", n=3)
    (tmp_path / "c" / "labels.txt").write_text("# stem label\nimg2 5\n\nimg0 3\nimg1 4\n")
    ds = NpyLatentFolder(tmp_path / "c", num_classes=10)
    assert [int(ds[i][1]) for i in range(3)] == [3, 4, 5] and ds.num_classes == 10


def test_explicit_labels_file_elsewhere(tmp_path):
    make_folder(tmp_path / "lat", n=3)
    (tmp_path / "my_labels.txt").write_text("img0 1\nimg1 1\nimg2 0\n")
    ds = NpyLatentFolder(tmp_path / "lat", labels_file=tmp_path / "my_labels.txt")
    assert [int(ds[i][1]) for i in range(3)] == [1, 1, 0]


@pytest.mark.parametrize("fmt", ["npy", "json", "txt"])
@pytest.mark.parametrize("bad", [3, -1])
def test_label_out_of_range(tmp_path, fmt, bad):
    names = make_folder(tmp_path, n=3)
    values = [0, bad, 1]
    if fmt == "npy":
        np.save(tmp_path / "labels.npy", np.array(values))
    elif fmt == "json":
        (tmp_path / "labels.json").write_text(json.dumps(dict(zip(names, values))))
    else:
        (tmp_path / "labels.txt").write_text("".join(f"{n} {v}\n" for n, v in zip(names, values)))
    msg = expect_error(lambda: NpyLatentFolder(tmp_path, num_classes=3), f"labels.{fmt}")
    assert "img1" in msg


def test_bad_labels_files(tmp_path):
    make_folder(tmp_path, n=3)
    np.save(tmp_path / "labels.npy", np.array([0, 1]))
    expect_error(lambda: NpyLatentFolder(tmp_path), "labels.npy")
    (tmp_path / "labels.json").write_text(json.dumps({"img0": 0, "img1": 1}))
    expect_error(lambda: NpyLatentFolder(tmp_path), "labels.")  # two labels files
    os.remove(tmp_path / "labels.npy")
    msg = expect_error(lambda: NpyLatentFolder(tmp_path), "labels.json")
    assert "img2" in msg
    os.remove(tmp_path / "labels.json")
    (tmp_path / "labels.txt").write_text("img0 0\nimg1 x\nimg2 1\n")
    expect_error(lambda: NpyLatentFolder(tmp_path), "labels.txt")


def test_empty_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("no latents here")
    expect_error(lambda: NpyLatentFolder(tmp_path), str(tmp_path))
    expect_error(lambda: NpyLatentFolder(tmp_path / "missing"), "missing")


def test_shards_without_manifest_say_it_is_missing(tmp_path):
    np.save(tmp_path / "shard-00000.npy", np.zeros((3, 2, 2, *SHAPE), np.float16))
    np.save(tmp_path / "shard-00000.labels.npy", np.zeros(3, np.int64))
    msg = expect_error(lambda: open_latent_dataset(tmp_path), "manifest.json is missing")
    assert "dit extract" in msg and f"dit data verify {tmp_path}" in msg and "int64" not in msg


@pytest.mark.parametrize(
    "arr",
    [np.zeros((4, 2), np.float32), np.zeros((2, 4, 2, 3), np.float32), np.zeros((4, 2, 5), np.float32),
     np.zeros(SHAPE, np.int64)],
    ids=["2d", "batch-of-2", "other-shape", "int-dtype"],
)
def test_bad_latent_shape_or_dtype(tmp_path, arr):
    make_folder(tmp_path, n=3)
    np.save(tmp_path / "img9.npy", arr)
    expect_error(lambda: NpyLatentFolder(tmp_path), "img9.npy")


def test_truncated_and_garbage_npy(tmp_path):
    make_folder(tmp_path, n=3)
    data = (tmp_path / "img1.npy").read_bytes()
    (tmp_path / "img1.npy").write_bytes(data[:-8])
    msg = expect_error(lambda: NpyLatentFolder(tmp_path), "img1.npy")
    assert "truncated" in msg
    (tmp_path / "img1.npy").write_bytes(data[:20])  # header cut short
    expect_error(lambda: NpyLatentFolder(tmp_path), "img1.npy")
    (tmp_path / "img1.npy").write_bytes(b"definitely not numpy")
    expect_error(lambda: NpyLatentFolder(tmp_path), "img1.npy")


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_latent_caught_on_load(tmp_path, value):
    make_folder(tmp_path, n=3)
    bad = latent(2)
    bad[1, 0, 0] = value
    np.save(tmp_path / "img2.npy", bad)
    ds = NpyLatentFolder(tmp_path)  # construction reads headers only
    ds[0]
    expect_error(lambda: ds[2], "img2.npy")


def test_fastdit_layout(tmp_path):
    labels = [5, 3, 0, 7, 1, 2, 9, 4, 8, 6, 3]  # 11 files: 10.npy must come after 9.npy
    make_fastdit(tmp_path, labels)
    ds = FastDiTFeatures(tmp_path)
    assert len(ds) == 11 and ds.latent_shape == SHAPE and ds.num_classes == 10
    for i in range(11):
        x, y = ds[i]
        assert x.dtype == torch.float32 and tuple(x.shape) == SHAPE and y.dtype == torch.int64
        np.testing.assert_array_equal(x.numpy(), latent(i))
        assert int(y) == labels[i]
    expect_error(lambda: FastDiTFeatures(tmp_path, num_classes=8), os.path.join("imagenet256_labels", "6.npy"))


def test_fastdit_unbatched_features_scalar_labels(tmp_path):
    make_fastdit(tmp_path, [1, 0, 1], batch_dim=False, scalar_labels=True)
    ds = FastDiTFeatures(tmp_path, num_classes=1000)
    assert ds.num_classes == 1000 and [int(ds[i][1]) for i in range(3)] == [1, 0, 1]


def test_fastdit_missing_or_bad_label(tmp_path):
    make_fastdit(tmp_path, [1, 0, 1])
    os.remove(tmp_path / "imagenet256_labels" / "1.npy")
    msg = expect_error(lambda: FastDiTFeatures(tmp_path), os.path.join("imagenet256_labels", "1.npy"))
    assert "missing" in msg
    np.save(tmp_path / "imagenet256_labels" / "1.npy", np.array([1, 2]))
    expect_error(lambda: FastDiTFeatures(tmp_path), os.path.join("imagenet256_labels", "1.npy"))
    np.save(tmp_path / "imagenet256_labels" / "1.npy", np.array([-4]))
    expect_error(lambda: FastDiTFeatures(tmp_path), os.path.join("imagenet256_labels", "1.npy"))


def test_flip_is_deterministic_per_seed_epoch_index(tmp_path):
    make_folder(tmp_path, n=16)
    a = NpyLatentFolder(tmp_path, random_flip=True, seed=7)
    b = NpyLatentFolder(tmp_path, random_flip=True, seed=7)
    plain = NpyLatentFolder(tmp_path)
    a.set_epoch(3)
    b.set_epoch(3)
    flips = []
    for i in range(16):
        xa, xb = a[i][0], b[i][0]
        assert torch.equal(xa, xb)
        flipped = flip_for(7, 3, i)
        assert torch.equal(xa, plain[i][0].flip(-1) if flipped else plain[i][0])
        flips.append(flipped)
    assert 0 < sum(flips) < 16
    assert flips != [flip_for(7, 4, i) for i in range(16)]
    assert flips != [flip_for(8, 3, i) for i in range(16)]


def test_dataloader_workers_match(tmp_path):
    make_folder(tmp_path, n=12)
    np.save(tmp_path / "labels.npy", np.arange(12) % 3)
    ds = NpyLatentFolder(tmp_path, random_flip=True, seed=1)
    ds.set_epoch(2)
    runs = []
    for workers in (0, 2):
        loader = DataLoader(ds, batch_size=4, shuffle=False, num_workers=workers)
        runs.append([(x.clone(), y.clone()) for x, y in loader])
    for (x0, y0), (x2, y2) in zip(*runs):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)


def test_open_latent_dataset_detects_layout(tmp_path, monkeypatch):
    make_folder(tmp_path / "folder", n=2)
    assert type(open_latent_dataset(tmp_path / "folder")) is NpyLatentFolder

    make_fastdit(tmp_path / "fast", [0, 1])
    assert type(open_latent_dataset(tmp_path / "fast")) is FastDiTFeatures
    ds = open_latent_dataset(tmp_path / "fast" / "imagenet256_features", random_flip=True, seed=3)
    assert type(ds) is FastDiTFeatures and ds.num_classes == 2 and ds.random_flip and ds.seed == 3

    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "manifest.json").write_text("{}")
    seen = {}

    class FakeShards:
        num_classes = 10

        def __init__(self, path, random_flip=False, seed=0):
            seen.update(path=path, random_flip=random_flip, seed=seed)

    # A manifest opens through text_shards.open_shards (LatentShards, or TextShards when it records captions).
    from dit_trainer.data import text_shards

    monkeypatch.setattr(text_shards, "open_shards", FakeShards)
    assert type(open_latent_dataset(tmp_path / "shards", random_flip=True, seed=5)) is FakeShards
    assert seen == {"path": str(tmp_path / "shards"), "random_flip": True, "seed": 5}
    expect_error(lambda: open_latent_dataset(tmp_path / "shards", num_classes=5), "manifest.json")

    expect_error(lambda: open_latent_dataset(tmp_path / "nowhere"), "nowhere")


def test_threaded_scan_same_result_and_errors(tmp_path, monkeypatch):
    from dit_trainer.data import latents

    make_fastdit(tmp_path, [0, 1, 2, 1])
    serial = FastDiTFeatures(tmp_path)
    monkeypatch.setattr(latents, "_PARALLEL_SCAN_MIN", 2)
    threaded = FastDiTFeatures(tmp_path)
    assert threaded.paths == serial.paths and np.array_equal(threaded.labels, serial.labels)
    np.save(tmp_path / "imagenet256_features" / "2.npy", np.zeros((4, 2, 5), np.float32))
    expect_error(lambda: FastDiTFeatures(tmp_path), os.path.join("imagenet256_features", "2.npy"))
