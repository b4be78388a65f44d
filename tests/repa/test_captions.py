"""REPA on captions: a PixArt trained on `dit extract --text-encoder --keep-images` shards, or on the captioned
folder itself (its latent cache re-reads each crop), aligns its tokens with the frozen encoder's features of the
images, and the run samples from a prompt without the projector."""

import pytest
from tests.repa._tiny import TINY_REPA

from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """16 captioned 16 px images, a tiny VAE and a tiny T5, and their `dit extract --keep-images` shards."""
    pytest.importorskip("transformers")
    from dit_trainer.cli import main
    from tests.text_helpers import save_tiny_t5, write_captioned_folder
    from tests.train.trainer_helpers import save_tiny_vae

    root = tmp_path_factory.mktemp("repa_captions")
    write_captioned_folder(root / "images", count=16)
    vae, t5 = save_tiny_vae(root / "vae"), save_tiny_t5(root / "t5")
    assert main(["extract", "--data-path", str(root / "images"), "--vae", vae, "--image-size", "16", "--out",
                 str(root / "shards"), "--workers", "0", "--no-progress", "--keep-images", "--text-encoder", t5]) == 0
    return {"images": str(root / "images"), "vae": vae, "t5": t5, "shards": str(root / "shards")}


@pytest.mark.parametrize("source", ["shards", "online"])
def test_pixart_aligns_on_captioned_images(assets, tmp_path, source):
    from dit_trainer.cli import main

    run = tmp_path / "run"
    data = {"path": assets["shards"]} if source == "shards" else {
        "path": assets["images"], "text_encoder": assets["t5"], "vae": assets["vae"], "image_size": 16,
        "cache_dir": str(tmp_path / "cache")}
    DiTTrainer({"output_dir": str(run), "objective": "transport",
                "model": {"name": "PixArt-alpha-XL/2-256", "depth": 2, "hidden_size": 32, "num_heads": 2,
                          "learn_sigma": False},
                "data": {**data, "num_workers": 0, "caption_dropout_prob": 0.1},
                "optim": {"lr": 1e-3},
                "train": {"max_steps": 40, "global_batch_size": 16, "mixed_precision": "fp32", "device": "cpu"},
                "checkpoint": {"save_steps": 40},
                "logging": {"log_steps": 10, "tensorboard": False, "progress": False},
                "repa": dict(TINY_REPA)}).train()
    records = read_metrics(run / "metrics.jsonl")
    first, last = records[0], records[-1]
    assert last["repa_loss"] < first["repa_loss"] - 0.1, records  # the cosine with the encoder's tokens grows
    assert last["loss"] < first["loss"], records
    for r in records:  # the logged total is the two terms, weighted
        assert r["loss"] == pytest.approx(r["denoising_loss"] + 0.5 * r["repa_loss"], rel=1e-6, abs=1e-7)
    # Sampling builds the denoiser alone from the run's weights: the projector is left behind.
    assert main(["sample", "--ckpt", str(run), "--prompt", "a red cat", "--num-samples", "2", "--steps", "2",
                 "--out", str(tmp_path / "grid.png"), "--device", "cpu", "--no-progress"]) == 0
    assert (tmp_path / "grid.png").is_file()
