"""A small random network standing in for Inception, and random uint8 images, for the evaluate tests."""

import numpy as np
import pytest
import torch
import torch.nn as nn


class TinyNet(nn.Module):
    """Stands in for Inception: same interface, random weights, a few thousand parameters."""

    name = "tiny"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, stride=2)
        self.bn = nn.BatchNorm2d(8)  # eval mode: per-image, so batching must not matter
        self.fc = nn.Linear(8, 5)

    def forward(self, images):
        h = torch.relu(self.bn(self.conv(images / 127.5 - 1.0)))
        pool = h.mean((2, 3))
        return {"pool": pool, "spatial": h[:, :2].permute(0, 2, 3, 1).flatten(1), "logits": self.fc(pool)}


def _random_images(n=23, size=12, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


@pytest.fixture
def tiny_net():
    """A fresh TinyNet (same weights every time)."""
    return TinyNet()


@pytest.fixture
def make_images():
    """make_images(n=23, size=12, seed=0): random uint8 N×size×size×3."""
    return _random_images
