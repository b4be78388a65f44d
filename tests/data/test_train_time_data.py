"""What training checks as it reads data (what `dit data verify` checks, cheaply), and that
`dit extract` lists each real image once however symlinks loop."""

import json
import os

import numpy as np
import pytest
from tests.data.test_shards import SHAPE, make_shards

from dit_trainer.data.images import list_image_folder
from dit_trainer.data.latents import NpyLatentFolder
from dit_trainer.data.shards import LatentShards
from dit_trainer.errors import DataError


def _edit(root, **fields):
    m = json.loads((root / "manifest.json").read_text())
    m.update(fields)
    (root / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("fields,match", [
    ({"dtype": "int8"}, "dtype 'int8'"),
    ({"latent_shape": [4, 8]}, "latent_shape"),
    ({"num_classes": 0}, "num_classes"),
    ({"shards": [{"name": "../../etc/passwd", "count": 12}]}, "does not name a file"),
])
def test_shard_manifest_values(tmp_path, fields, match):
    make_shards(tmp_path)
    _edit(tmp_path, **fields)
    with pytest.raises(DataError, match=match):
        LatentShards(tmp_path)


def test_manifest_shape_larger_than_the_shards_is_refused_before_allocating(tmp_path):
    # Sized by the manifest alone, one row of this shape would ask for about 30 GiB.
    make_shards(tmp_path)
    _edit(tmp_path, latent_shape=[1, 62976, 62976])
    with pytest.raises(DataError, match="manifest says"):
        LatentShards(tmp_path)[0]


@pytest.mark.parametrize("labels,match", [
    (np.array([0.0, 1.5, 2.0, 1.0]), "float64 labels"),
    (np.array([0, 1, 3, 1]), "label 3 .*outside 0..2"),  # 3 == num_classes: never the null class
    (np.array([0, -1, 2, 1]), "label -1"),
    (np.array([0, 99, 2, 1]), "label 99"),
])
def test_shard_labels(tmp_path, labels, match):
    make_shards(tmp_path, counts=(4,))
    np.save(tmp_path / "shard-00000.labels.npy", labels)
    with pytest.raises(DataError, match=match):
        LatentShards(tmp_path)


def test_shard_array_dtype_and_nan(tmp_path):
    make_shards(tmp_path, counts=(4,), dtype="float32")
    arr = np.load(tmp_path / "shard-00000.npy")
    np.save(tmp_path / "shard-00000.npy", arr.astype(np.float16))
    with pytest.raises(DataError, match="float16, manifest says float32"):
        LatentShards(tmp_path, random_flip=False)[0]
    arr[2, 0, 0, 1, 2, 3] = np.nan
    np.save(tmp_path / "shard-00000.npy", arr)
    ds = LatentShards(tmp_path, random_flip=False, sample_posterior=False)
    ds[1]
    with pytest.raises(DataError, match="row 2 holds NaN"):
        ds[2]


def test_npy_values_overflowing_float32(tmp_path):
    np.save(tmp_path / "0.npy", np.full(SHAPE, 1e300, dtype=np.float64))
    with pytest.raises(DataError, match="beyond float32"):
        NpyLatentFolder(tmp_path)[0]


def test_labels_past_int64(tmp_path):
    np.save(tmp_path / "0.npy", np.zeros(SHAPE, dtype=np.float32))
    (tmp_path / "labels.json").write_text('{"0": 1180591620717411303424}')  # 2**70
    with pytest.raises(DataError, match="not a class id"):
        NpyLatentFolder(tmp_path, num_classes=10)


def test_model_vs_data_latent_shape(tmp_path):
    from tests.train.trainer_helpers import tiny_config, write_npy_latents

    from dit_trainer.train import DiTTrainer

    from dit_trainer.errors import ConfigError

    data = write_npy_latents(tmp_path / "latents", n=8, shape=(3, 8, 8))
    # The config sets in_channels 4 explicitly, so the conflict with the data is found at build time.
    with pytest.raises(ConfigError, match="model.in_channels is 4 but .* holds 3-channel latents") as err:
        DiTTrainer(tiny_config(tmp_path / "run", data={"path": str(data)}))
    assert "\n" not in str(err.value)
    # A dataset handed in directly decides the shape too, and is checked against the config alike.
    from dit_trainer.data.latents import NpyLatentFolder

    with pytest.raises(ConfigError, match="model.in_channels is 4 but the NpyLatentFolder given to the trainer holds 3-ch"):
        DiTTrainer(tiny_config(tmp_path / "run2"), dataset=NpyLatentFolder(str(data), num_classes=10))
    config = tiny_config(tmp_path / "run3")
    del config["model"]["in_channels"]
    trainer = DiTTrainer(config, dataset=NpyLatentFolder(str(data), num_classes=10))
    assert trainer.sample_shape == (3, 8, 8)


def test_extract_listing_survives_symlink_loops(tmp_path):
    from PIL import Image

    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            Image.new("RGB", (4, 4)).save(tmp_path / cls / f"{i}.png")
    os.symlink(tmp_path, tmp_path / "a" / "loop")  # the whole dataset, inside class a
    os.symlink(tmp_path / "b", tmp_path / "b" / "self")
    os.symlink(tmp_path / "a" / "0.png", tmp_path / "a" / "again.png")
    paths, labels, names = list_image_folder(tmp_path)
    assert names == ["a", "b"] and len(paths) == 6
    assert sorted(os.path.basename(p) for p in paths) == ["0.png", "0.png", "1.png", "1.png", "2.png", "2.png"]
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]
