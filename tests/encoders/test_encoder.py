"""Encoder.encode: shapes, preprocessing, and that the encoder stays frozen and in eval mode."""

import pytest
import torch

from dit_trainer.encoders import preprocess
from dit_trainer.errors import ConfigError
from tests.encoders.encoder_helpers import images, tiny_encoder


@pytest.mark.parametrize("name", ["dinov2_vitb14", "dinov2_vitg14_reg"])
@pytest.mark.parametrize("size", [224, 56])
def test_encode_shapes(name, size):
    encoder = tiny_encoder(name)
    patches, cls = encoder.encode(images(size=64), size)
    assert patches.shape == (2, (size // 14) ** 2, encoder.embed_dim)
    assert cls.shape == (2, encoder.embed_dim)
    assert encoder.patch_size == 14 and encoder.num_register_tokens == (4 if name.endswith("_reg") else 0)
    assert torch.isfinite(patches).all() and torch.isfinite(cls).all()


def test_encode_is_forward_features_of_the_preprocessed_images():
    encoder, x = tiny_encoder("dinov2_vits14_reg"), images(size=80)
    patches, cls = encoder.encode(x, 56)
    out = encoder.forward_features(preprocess(x, 56))
    assert torch.equal(patches, out["x_norm_patchtokens"]) and torch.equal(cls, out["x_norm_clstoken"])
    assert out["x_norm_regtokens"].shape == (2, 4, encoder.embed_dim)


def test_grayscale_is_repeated_to_three_channels():
    encoder, gray = tiny_encoder(), images(channels=1)
    assert torch.equal(encoder.encode(gray, 56)[0], encoder.encode(gray.repeat(1, 3, 1, 1), 56)[0])


def test_frozen_and_always_eval():
    encoder = tiny_encoder()
    assert not encoder.training and not any(p.requires_grad for p in encoder.parameters())
    assert encoder.train() is encoder and not encoder.training
    assert not any(m.training for m in encoder.modules())
    with torch.enable_grad():
        patches, cls = encoder.encode(images(), 56)
    assert not patches.requires_grad and not cls.requires_grad
    wrapper = torch.nn.Sequential(encoder).train()
    assert wrapper.training and not encoder.training


@pytest.mark.parametrize("size", [230, 0, 13])
def test_size_not_a_multiple_of_the_patch_is_one_line(size):
    with pytest.raises(ConfigError, match="multiple of the patch size 14") as err:
        tiny_encoder().encode(images(), size)
    assert "\n" not in str(err.value)


def test_bad_images_are_one_line():
    encoder = tiny_encoder()
    with pytest.raises(ConfigError, match="divide uint8 images by 255"):
        encoder.encode((images() * 255).to(torch.uint8), 56)
    with pytest.raises(ConfigError, match=r"\(B, 3, H, W\)"):
        encoder.encode(images()[:, :2], 56)


def test_bf16_encoder_runs_in_bf16():
    encoder = tiny_encoder().to(torch.bfloat16)
    patches, _ = encoder.encode(images(), 56)
    assert patches.dtype == torch.bfloat16
    reference, _ = tiny_encoder().encode(images(), 56)
    assert (patches.float() - reference).abs().max() < 0.1 * reference.abs().max()
