"""Tiny random DiT, VAE and checkpoint folders for the converter tests."""

import pytest
import torch

pytest.importorskip("diffusers")

from tests.convert.convert_helpers import CLASS_NAMES, TINY, randomize  # noqa: E402


@pytest.fixture(scope="session")
def vae_dir(tmp_path_factory):
    """A random 2-level AutoencoderKL saved with save_pretrained (as tests/data/test_extract.py)."""
    from diffusers import AutoencoderKL

    folder = tmp_path_factory.mktemp("vae")
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                        norm_num_groups=8, sample_size=16)
    vae.save_pretrained(folder)
    return str(folder)


def _tiny(num_classes):
    from dit_trainer.convert.model_config import build_dit

    cfg = {**TINY, "num_classes": num_classes}
    return cfg, randomize(build_dit(cfg), seed=num_classes).eval()


def _write_ours(root, num_classes, vae_dir, names):
    from dit_trainer.convert import Bundle, write

    cfg, model = _tiny(num_classes)
    bundle = Bundle(state_dict=model.state_dict(), model=cfg, vae=vae_dir, scaling_factor=0.5, class_names=names)
    return write("ours", bundle, root / "ckpt")


@pytest.fixture(scope="session")
def ours_dir(tmp_path_factory, vae_dir):
    """Our checkpoint folder (config.yaml + ema.safetensors + vae/ + labels.json), 10 named classes."""
    return _write_ours(tmp_path_factory.mktemp("ours10"), 10, vae_dir, list(CLASS_NAMES))


@pytest.fixture(scope="session")
def ours_dir_1k(tmp_path_factory, vae_dir):
    """The same with ImageNet's 1000 classes: diffusers' DiTPipeline takes class 1000 as the null class."""
    return _write_ours(tmp_path_factory.mktemp("ours1k"), 1000, vae_dir, None)
