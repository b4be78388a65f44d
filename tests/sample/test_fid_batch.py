"""The one FID-batch writer: balanced labels, per-chunk seeds, and the same arrays from `dit sample --npz`
as from `dit sample-ddp`."""

import numpy as np
import pytest
import torch
import yaml

from dit_trainer.checkpoint import save_checkpoint
from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.models import get_spec
from dit_trainer.sample.fid_batch import chunk_labels, chunk_seed, rank_chunks


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    cfg = build_config({"model": {"name": "DiT-S/4", "input_size": 8, "in_channels": 1, "num_classes": 10,
                                      "depth": 1, "hidden_size": 32, "num_heads": 2}, "data": {"path": "digits"}})
    torch.manual_seed(0)
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    files = {"ema.safetensors": model.state_dict(), "model.safetensors": model.state_dict(),
             "config.yaml": yaml.safe_dump(cfg.to_dict(), sort_keys=False)}
    return save_checkpoint(tmp_path_factory.mktemp("fid") / "run", 1, files)


def test_labels_cover_classes_uniformly():
    labels = chunk_labels(40, 4, seed=3)
    assert np.bincount(labels).tolist() == [10, 10, 10, 10]
    assert not np.array_equal(labels, chunk_labels(40, 4, seed=4))
    chosen = chunk_labels(9, [7, 2, 5], seed=3)
    assert sorted(chosen.tolist()) == [2, 2, 2, 5, 5, 5, 7, 7, 7] and chosen.dtype == np.int64


def test_chunks_and_seeds_do_not_depend_on_the_ranks():
    assert list(rank_chunks(10, 3)) == [0, 1, 2, 3]
    assert sorted([*rank_chunks(10, 3, 0, 2), *rank_chunks(10, 3, 1, 2)]) == [0, 1, 2, 3]
    assert chunk_seed(7, 2) == chunk_seed(7, 2) != chunk_seed(7, 3)


FLAGS = ["--num-samples", "5", "--batch-size", "2", "--seed", "3", "--cfg-scale", "2", "--sampler", "ddim", "--steps",
         "2", "--device", "cpu", "--no-progress"]


def test_sample_npz_writes_what_sample_ddp_writes(ckpt, tmp_path):
    one, ddp = tmp_path / "sample.npz", tmp_path / "ddp.npz"
    assert main(["sample", "--ckpt", str(ckpt), "--npz", str(one), *FLAGS]) == 0
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(ddp), *FLAGS]) == 0
    a, b = np.load(one), np.load(ddp)
    assert np.array_equal(a["arr_0"], b["arr_0"]) and np.array_equal(a["arr_1"], b["arr_1"])
    assert np.array_equal(a["arr_1"], chunk_labels(5, 10, 3))  # balanced: five classes once each
    assert a["arr_0"].std() > 0 and not np.array_equal(a["arr_0"][0], a["arr_0"][1])


def test_class_labels_are_balanced_over_those_classes(ckpt, tmp_path):
    out = tmp_path / "two.npz"
    assert main(["sample", "--ckpt", str(ckpt), "--npz", str(out), "--class-labels", "4", "6", *FLAGS]) == 0
    labels = np.load(out)["arr_1"]
    assert sorted(labels.tolist()) == [4, 4, 4, 6, 6]  # repeated in the order given, then shuffled
    assert np.array_equal(labels, chunk_labels(5, [4, 6], 3))
