"""Sample grids during training need the latents' VAE: a missing VAE folder is a one-line error
before step 1 naming data.vae (and the manifest it came from), not a crash at the first grid."""

import pytest
from tests.train.trainer_helpers import tiny_config, write_npy_latents

from dit_trainer.config import build_config
from dit_trainer.data.shards import write_manifest
from dit_trainer.errors import ConfigError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.preflight import check_grid_vae


def _manifest_folder(tmp_path, vae):
    folder = tmp_path / "shards"
    folder.mkdir()
    write_manifest(str(folder), count=0, latent_shape=[4, 8, 8], dtype="float16", num_classes=10,
                   class_names=[str(i) for i in range(10)], vae=vae, scaling_factor=0.18215, image_size=64,
                   flips=False, posterior="mean_std", shards=[])
    return folder


def test_missing_vae_from_the_manifest_names_both(tmp_path):
    gone = str(tmp_path / "gone_vae")
    cfg = build_config(tiny_config(tmp_path / "run", data={"path": str(_manifest_folder(tmp_path, gone))},
                                       logging={"image_steps": 4}))
    cfg.data.vae = gone  # what shape_from_data takes from the manifest
    with pytest.raises(ConfigError) as err:
        check_grid_vae(cfg)
    text = str(err.value)
    assert text.startswith(f"data.vae {gone} (recorded in ") and "manifest.json" in text and "\n" not in text
    cfg.logging.image_steps = 0
    check_grid_vae(cfg)  # no grids, no VAE needed


def test_missing_vae_fails_before_step_1(tmp_path):
    data = write_npy_latents(tmp_path / "latents", n=8)
    gone = str(tmp_path / "gone_vae")
    trainer = DiTTrainer(tiny_config(tmp_path / "run", data={"path": str(data), "vae": gone},
                                     train={"global_batch_size": 4}, logging={"image_steps": 4}))
    with pytest.raises(ConfigError, match=f"^data.vae {gone} does not exist") as err:
        trainer.train()
    assert "manifest" not in str(err.value) and trainer.step == 0
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_hub_id_is_left_to_the_loader(tmp_path):
    pytest.importorskip("diffusers")
    cfg = build_config(tiny_config(tmp_path / "run", data={"path": str(tmp_path), "vae": "org/some-vae"},
                                       logging={"image_steps": 4}))
    check_grid_vae(cfg)
