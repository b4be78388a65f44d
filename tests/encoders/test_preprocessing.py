"""preprocess: ImageNet normalisation then plain bicubic resizing, REPA's order and interpolation."""

import torch
import torch.nn.functional as F

from dit_trainer.encoders import IMAGENET_MEAN, IMAGENET_STD, preprocess
from tests.encoders.encoder_helpers import images


def test_the_imagenet_mean_maps_to_zero_and_one_std_to_one():
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1).expand(1, 3, 28, 28)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert preprocess(mean, 28).abs().max() < 1e-6
    assert (preprocess(mean + std, 28) - 1).abs().max() < 1e-5


def test_resize_is_bicubic_without_antialias_after_normalising():
    x = images(size=64)
    normalised = preprocess(x, 64)
    out = preprocess(x, 56)
    assert torch.equal(out, F.interpolate(normalised, size=(56, 56), mode="bicubic"))
    assert not torch.allclose(out, F.interpolate(normalised, size=(56, 56), mode="bicubic", antialias=True))


def test_dtype():
    assert preprocess(images(), 56, dtype=torch.bfloat16).dtype == torch.bfloat16
