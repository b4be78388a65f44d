"""Training from captioned images with `data.text_encoder`: the latent cache encodes each caption beside
its image as batches need them, and gives the batches `dit extract --text-encoder` + its shards give."""

import os

import numpy as np
import pytest
import torch

from tests.text_helpers import save_tiny_t5, write_captioned_folder
from tests.train.trainer_helpers import save_tiny_vae

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from dit_trainer.data.extract import run_extract  # noqa: E402
from dit_trainer.data.loader import GlobalBatchSampler, StepLoader  # noqa: E402
from dit_trainer.data.online import open_image_folder  # noqa: E402
from dit_trainer.data.online.encoder import encoder_for  # noqa: E402
from dit_trainer.data.text_shards import TextShards, open_shards  # noqa: E402
from dit_trainer.data.tools import verify  # noqa: E402

SIZE, BATCH, MAX_LENGTH = 16, 4, 12


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("online_captions")
    write_captioned_folder(root / "images", count=10)
    vae, t5 = save_tiny_vae(root / "vae"), save_tiny_t5(root / "t5")
    run_extract(str(root / "images"), vae, SIZE, root / "shards", workers=0, progress=False, text_encoder=t5,
                text_max_length=MAX_LENGTH)
    return {"root": root, "images": str(root / "images"), "vae": vae, "t5": t5, "shards": root / "shards"}


def _open(assets, cache):
    text = {"encoder": assets["t5"], "max_length": MAX_LENGTH, "dtype": "auto", "empty": "error"}
    return open_image_folder(assets["images"], vae=assets["vae"], image_size=SIZE, device="cpu", cache_dir=str(cache),
                             text=text)


def _batches(dataset, steps, stage=None):
    loader = StepLoader(dataset, GlobalBatchSampler(len(dataset), BATCH, seed=0), stage=stage)
    return [next(loader) for _ in range(steps)], loader


def _assert_equal(got, want):
    for a, b in zip(got, want):
        assert set(a) == set(b) == {"x", "text_embeds", "text_mask"}
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_online_batches_are_extracts_and_the_cache_becomes_its_shards(assets, tmp_path):
    dataset = _open(assets, tmp_path / "cache")
    want, _ = _batches(open_shards(assets["shards"]), 5)
    got, _ = _batches(dataset, 5, encoder_for(dataset, "cpu"))  # 2 batches an epoch: the cache completes at step 3
    _assert_equal(got, want)
    (folder,) = [os.path.join(tmp_path / "cache", n) for n in os.listdir(tmp_path / "cache")]
    assert verify(folder) == []
    for name in ("shard-00000.npy", "shard-00000.text_embeds.npy", "shard-00000.text_mask.npy", "null_text.safetensors"):
        assert open(os.path.join(folder, name), "rb").read() == (assets["shards"] / name).read_bytes(), name
    again = _open(assets, tmp_path / "cache")
    assert isinstance(again, TextShards)
    assert all(torch.equal(v, open_shards(assets["shards"]).null_text()[k]) for k, v in again.null_text().items())


def test_a_resumed_first_epoch_reads_the_captions_it_encoded(assets, tmp_path):
    dataset = _open(assets, tmp_path / "cache")
    assert dataset.null_text()["text_embeds"].shape == (MAX_LENGTH, 32)  # before any batch, from the cache folder
    stage = encoder_for(dataset, "cpu")
    first, loader = _batches(dataset, 1, stage)
    loader.flush()  # what a checkpoint does: the encoded rows are a piece of the cache
    reopened = _open(assets, tmp_path / "cache")
    assert reopened.where.covered == BATCH
    again, _ = _batches(reopened, 1, encoder_for(reopened, "cpu"))  # every row read from the piece
    _assert_equal(again, first)
    want, _ = _batches(open_shards(assets["shards"]), 1)
    _assert_equal(again, want)


def test_captioned_folder_fills_the_config_from_its_encoder(assets, tmp_path):
    from dit_trainer.config import build_config
    from dit_trainer.data.loader import DataShapes

    source = {"data": {"path": assets["images"], "text_encoder": os.path.relpath(assets["t5"]), "vae": assets["vae"],
                       "image_size": SIZE, "cache_dir": str(tmp_path / "cache"), "num_workers": 0},
              "train": {"device": "cpu"}}
    shapes = DataShapes()
    cfg = build_config(source, shapes=shapes)
    assert cfg.data.text_max_length == 120 and (cfg.model.in_channels, cfg.model.input_size) == (4, 8)
    assert shapes.dataset.text_encoder == assets["t5"]  # its folder, absolute, for sampling and export
    assert shapes.dataset.text_hidden_size == 32 and shapes.dataset.num_classes is None
    assert np.array_equal(shapes.dataset.labels, np.zeros(10, dtype=np.int64))


@pytest.mark.parametrize("name,tokens", [("PixArt-Sigma-XL/2-256", 300), ("PixArt-alpha-XL/2-256", 120)])
def test_captions_take_the_familys_release_length(assets, tmp_path, name, tokens):
    """data.text_max_length 0 means the model family's release length (Sigma 300), not the encoder's default."""
    from dit_trainer.config import build_config
    from dit_trainer.data.loader import DataShapes

    source = {"model": {"name": name, "depth": 1, "hidden_size": 48, "num_heads": 4},
              "data": {"path": assets["images"], "text_encoder": assets["t5"], "vae": assets["vae"], "image_size": SIZE,
                       "cache_dir": str(tmp_path / "cache"), "num_workers": 0},
              "train": {"device": "cpu"}}
    shapes = DataShapes()
    cfg = build_config(source, shapes=shapes)
    assert cfg.data.text_max_length == tokens and shapes.dataset.text_max_length == tokens
