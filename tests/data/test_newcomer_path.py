"""A newcomer's path: an image folder -> `dit extract` -> `dit train` with a shipped config -> `dit sample`,
setting no model key: the data decides the model's shape and the class names."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

pytest.importorskip("diffusers")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.config import build_config  # noqa: E402
from dit_trainer.data.loader import DataShapes  # noqa: E402
from dit_trainer.errors import ConfigError, DataError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def config_with_data(source, overrides=None):
    """(Config, dataset) as the trainer builds them: the data fills the shapes the source leaves out."""
    shapes = DataShapes()
    return build_config(source, overrides, shapes=shapes), shapes.dataset


def tiny_vae(folder):
    """A random 2-level AutoencoderKL (8x downsampling like SD's, 4 latent channels)."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 8, 8, 8), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=1, latent_channels=4,
                        norm_num_groups=8, sample_size=64)
    vae.save_pretrained(folder)
    return str(folder)


def images(root):
    """Two classes in several sizes and modes."""
    rng = np.random.default_rng(0)
    specs = {"cat": [((80, 64, 3), None), ((70, 90), "L"), ((64, 64, 4), "RGBA")],
             "dog": [((100, 70, 3), None), ((64, 128, 3), None), ((96, 96, 2), "LA")]}
    for cls, files in specs.items():
        (root / cls).mkdir(parents=True)
        for i, (shape, mode) in enumerate(files):
            arr = rng.integers(0, 256, shape, dtype=np.uint8)
            (Image.fromarray(arr, mode) if mode else Image.fromarray(arr)).save(root / cls / f"{i}.png")
    return str(root)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("newcomer")
    vae, data, out = tiny_vae(root / "vae"), images(root / "images"), root / "latents"
    # A wrong --vae first: it must fail without recording anything that locks the folder.
    assert main(["extract", "--data-path", data, "--vae", str(root / "no-such-vae"), "--image-size", "64",
                 "--out", str(out), "--workers", "0", "--no-progress"]) == 2
    assert not (out / "extract.json").exists()
    assert main(["extract", "--data-path", data, "--vae", vae, "--image-size", "64", "--out", str(out),
                 "--workers", "0", "--no-progress"]) == 0
    return {"root": root, "vae": vae, "out": str(out)}


def test_extract_train_sample_without_model_keys(shards, capsys):
    run = shards["root"] / "run"
    # Only run-size overrides: steps, batch, device, workers, where to write.
    assert main(["train", "--config", str(ROOT / "configs" / "dit_s2_latents.yaml"), "--data.path", shards["out"],
                 "--train.max_steps", "2", "--train.global_batch_size", "4", "--train.device", "cpu",
                 "--data.num_workers", "0", "--output_dir", str(run), "--logging.progress", "false",
                 "--logging.tensorboard", "false"]) == 0
    saved = yaml.safe_load(next((run / "checkpoints").glob("step-*/config.yaml")).read_text())
    assert saved["model"]["input_size"] == 8 and saved["model"]["in_channels"] == 4
    assert saved["model"]["num_classes"] == 2 and saved["data"]["class_names"] == ["cat", "dog"]
    assert saved["data"]["vae"] == shards["vae"] and saved["data"]["image_size"] == 64
    # The class names are the dataset's, and the recorded VAE decodes the grid.
    grid = shards["root"] / "grid.png"
    assert main(["sample", "--ckpt", str(run), "--class-names", "cat", "dog", "--steps", "2", "--device", "cpu",
                 "--no-progress", "--out", str(grid)]) == 0
    assert Image.open(grid).size == (2 * (64 + 2) + 2, 64 + 4)


def test_conflict_names_both_values_and_the_key(shards):
    # Both values equal the defaults: set by the user, they still conflict with the data.
    with pytest.raises(ConfigError, match=r"model.input_size is 32 but .*manifest.json holds 8x8 latents; set model.input_size to 8"):
        config_with_data({"data.path": shards["out"], "model.input_size": 32})
    with pytest.raises(ConfigError, match="model.num_classes is 1000 .* 2 classes"):
        config_with_data({"data.path": shards["out"], "model.num_classes": "1000"})


def test_npy_folder_needs_labels_or_unconditional(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.zeros((4, 8, 8), np.float32))
    with pytest.raises(DataError, match="no labels file.*labels.json.*data.unconditional: true"):
        config_with_data(None, ["--data.path", str(tmp_path)])
    cfg, dataset = config_with_data(None, ["--data.path", str(tmp_path), "--data.unconditional", "true"])
    assert len(dataset) == 3 and cfg.model.num_classes == 1 and cfg.model.input_size == 8
    (tmp_path / "labels.json").write_text(json.dumps({"labels": {"0": 0, "1": 1, "2": 2}, "class_names": ["a", "b", "c"]}))
    cfg, _ = config_with_data({"data": {"path": str(tmp_path)}})
    assert cfg.model.num_classes == 3 and cfg.data.class_names == ["a", "b", "c"]
