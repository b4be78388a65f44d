"""A small CNN that recognises scikit-learn's digits: the feature network of the digits demo.

Inception features mean nothing on 16×16 grayscale digits, so the demo's FID/IS use this network
instead: "pool" is its 64-d penultimate layer (taken before the ReLU, so no unit is constantly 0
and the covariance stays full rank), "logits" its 10 class scores, "spatial" the first 7 channels
of its last 4×4 feature map (as ADM keeps 7 channels of mixed_6/conv). Its weights ship as
`assets/digit_features.safetensors` (85 k parameters, 340 kB), written by
`scripts/demo/train_digit_features.py`: shipped rather than trained on first use so every install
measures with the very same weights (CPU training is not bit-reproducible across torch builds
and machines, and FIDs from different weights are not comparable).
"""

from importlib import resources

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from dit_trainer.errors import DitError

DIGITS_WEIGHTS = "digit_features.safetensors"
DIGITS_SIZE = 16
SPATIAL_CHANNELS = 7


class DigitFeatureNet(nn.Module):
    """conv-pool, conv-pool, fc 64, fc 10 over 1×16×16 digits in [-1, 1]."""

    name = "digits"

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def embed(self, x):
        """(spatial map N×64×4×4, penultimate N×64 before ReLU) of N×1×16×16 digits in [-1, 1]."""
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return h, self.fc1(h.flatten(1))

    def classify(self, x):
        """Logits N×10 of N×1×16×16 digits in [-1, 1]."""
        return self.fc2(F.relu(self.embed(x)[1]))

    def forward(self, images):
        # As the demo writes digits: gray replicated to RGB, 0..255 for [-1, 1].
        x = images.float().mean(dim=1, keepdim=True) / 127.5 - 1.0
        if x.shape[-2:] != (DIGITS_SIZE, DIGITS_SIZE):
            x = F.interpolate(x, size=(DIGITS_SIZE, DIGITS_SIZE), mode="bilinear", align_corners=False, antialias=True)
        h, pool = self.embed(x)
        spatial = h[:, :SPATIAL_CHANNELS].permute(0, 2, 3, 1).flatten(1)
        return {"pool": pool, "spatial": spatial, "logits": self.fc2(F.relu(pool))}


def digit_split(holdout: float = 0.2, seed: int = 0):
    """(train, held-out) indices into load_digit_arrays(), stratified; the network never saw the held-out ones."""
    from sklearn.model_selection import train_test_split

    from dit_trainer.data.digits import load_digit_arrays

    labels = load_digit_arrays()[1]
    return train_test_split(np.arange(len(labels)), test_size=holdout, random_state=seed, stratify=labels)


def real_digits_uint8(indices=None) -> np.ndarray:
    """scikit-learn's digits as the demo's samples look: uint8 N×16×16×3."""
    from dit_trainer.data.digits import load_digit_arrays, upsample_digits

    images8 = load_digit_arrays()[0]
    if indices is not None:
        images8 = images8[np.asarray(indices)]
    x = upsample_digits(images8, DIGITS_SIZE)
    x = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).repeat(1, 1, 1, 3).numpy()


def load_digit_net(path=None, device="cpu") -> DigitFeatureNet:
    """The shipped digit network (or the weights at `path`), in eval mode."""
    from safetensors.torch import load_file

    from dit_trainer.evaluate.inception import load_state_dict_checked

    if path is None:
        ref = resources.files("dit_trainer") / "assets" / DIGITS_WEIGHTS
        if not ref.is_file():
            raise DitError(f"dit_trainer/assets/{DIGITS_WEIGHTS} is missing; run scripts/demo/train_digit_features.py")
        with resources.as_file(ref) as p:
            state, path = load_file(str(p)), p
    else:
        state = load_file(str(path))
    model = DigitFeatureNet()
    load_state_dict_checked(model, path, state)
    return model.to(device).eval().requires_grad_(False)
