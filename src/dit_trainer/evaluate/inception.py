"""The FID Inception-v3: the 2015-12-05 TensorFlow graph the ADM evaluator runs, in plain torch.

The architecture is torchvision's Inception-v3 with the graph's differences (average pools that
skip padding, a max pool in the last block, 1008 classes, TF1 resize to 299, inputs scaled from
0..255 to [-1, 1]). Parameter names follow torch-fidelity's converted weight file
(`weights-inception-2015-12-05-6726825d.pth`); pytorch-fid's file uses the same names and loads
too. Neither package is imported: both pull in torchvision at import time.

Outputs, as the ADM evaluator reads them from the graph:
  pool    N×2048  `pool_3`, for FID and precision/recall
  spatial N×2023  `mixed_6/conv` (the 1×1 branch of Mixed_6d, 17×17×192), first 7 channels,
                  flattened in TF's H, W, C order so ADM's `mu_s`/`sigma_s` line up
  logits  N×1008  pool @ fc.weight.T without the bias, the logits ADM's IS softmax uses
"""

import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from dit_trainer.errors import CheckpointError, DitError
from dit_trainer.evaluate.inception_weights import (INCEPTION_WEIGHTS_FILE, INCEPTION_WEIGHTS_URL,
                                                    fetch_inception_weights, note_other_weights)
from dit_trainer.evaluate.resize import resize_bilinear_tf1

INPUT_SIZE = 299
SPATIAL_CHANNELS = 7  # the ADM evaluator keeps mixed_6/conv[..., :7]


class BasicConv2d(nn.Module):
    """Convolution without bias, batch norm (TF's epsilon 0.001), ReLU."""

    def __init__(self, cin, cout, **kw):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kw)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _avg_pool_same(x):
    # TF's SAME average pool divides by the number of real pixels under the window.
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class _Block(nn.Module):
    """A mixed block: forward concatenates `branches(x)` along channels."""

    def forward(self, x):
        return torch.cat(self.branches(x), 1)


class InceptionA(_Block):
    """35×35 block: 1×1, 5×5, double 3×3 and pool branches."""

    def __init__(self, cin, pool_features):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(cin, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, kernel_size=1)

    def branches(self, x):
        return [
            self.branch1x1(x),
            self.branch5x5_2(self.branch5x5_1(x)),
            self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
            self.branch_pool(_avg_pool_same(x)),
        ]


class InceptionB(_Block):
    """35→17 reduction."""

    def __init__(self, cin):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def branches(self, x):
        return [
            self.branch3x3(x),
            self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
            F.max_pool2d(x, 3, stride=2),
        ]


class InceptionC(_Block):
    """17×17 block with factorised 7×7 convolutions."""

    def __init__(self, cin, c7):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, kernel_size=1)

    def branches(self, x):
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d = self.branch7x7dbl_1(x)
        for conv in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            d = conv(d)
        return [self.branch1x1(x), b7, d, self.branch_pool(_avg_pool_same(x))]


class InceptionD(_Block):
    """17→8 reduction."""

    def __init__(self, cin):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def branches(self, x):
        b = self.branch7x7x3_1(x)
        for conv in (self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4):
            b = conv(b)
        return [self.branch3x3_2(self.branch3x3_1(x)), b, F.max_pool2d(x, 3, stride=2)]


class InceptionE(_Block):
    """8×8 block with split 1×3/3×1 branches; the graph's last one pools by max, not average."""

    def __init__(self, cin, max_pool=False):
        super().__init__()
        self.max_pool = max_pool
        self.branch1x1 = BasicConv2d(cin, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(cin, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, kernel_size=1)

    def branches(self, x):
        b3 = self.branch3x3_1(x)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pooled = F.max_pool2d(x, 3, stride=1, padding=1) if self.max_pool else _avg_pool_same(x)
        return [
            self.branch1x1(x),
            torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1),
            torch.cat([self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d)], 1),
            self.branch_pool(pooled),
        ]


class FIDInceptionV3(nn.Module):
    """Inception-v3 as in the FID graph; forward(N×3×H×W floats in 0..255) -> {pool, spatial, logits}."""

    name = "inception"

    def __init__(self, num_classes=1008):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, c7=128)
        self.Mixed_6c = InceptionC(768, c7=160)
        self.Mixed_6d = InceptionC(768, c7=160)
        self.Mixed_6e = InceptionC(768, c7=192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048, max_pool=True)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, images):
        # Resize and scale stay in fp32 under autocast: they are the graph's input, not features.
        with torch.autocast(images.device.type, enabled=False):
            x = resize_bilinear_tf1(images.float(), INPUT_SIZE)
            x = (x - 128.0) / 128.0
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, 3, stride=2)
        for block in (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a, self.Mixed_6b, self.Mixed_6c):
            x = block(x)
        parts = self.Mixed_6d.branches(x)
        spatial = parts[0][:, :SPATIAL_CHANNELS].permute(0, 2, 3, 1).flatten(1)
        x = torch.cat(parts, 1)
        for block in (self.Mixed_6e, self.Mixed_7a, self.Mixed_7b, self.Mixed_7c):
            x = block(x)
        pool = x.float().mean(dim=(2, 3))  # the 64-value average in fp32 even under bf16
        logits = pool @ self.fc.weight.to(pool.dtype).t()
        return {"pool": pool, "spatial": spatial, "logits": logits}


def _read_state_dict(path: Path) -> dict:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle, zip and safetensors errors all mean "not a weights file"
        raise CheckpointError(f"{path}: cannot read weights ({type(err).__name__}: {err})".replace("\n", " ")) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state dict), got {type(state).__name__}")
    return state


def load_state_dict_checked(model: nn.Module, path, state: dict) -> None:
    """Load `state` into `model`, or one-line CheckpointError naming `path` and the first wrong key."""
    # BatchNorm counters are bookkeeping: torch-fidelity's file omits them, pytorch-fid's has them.
    expected = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    given = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked") and not k.startswith("AuxLogits.")}
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: not {type(model).__name__} weights ({len(missing)} missing keys, e.g. "
            f"{missing[:2]}; {len(unexpected)} unexpected, e.g. {unexpected[:2]})"
        )
    for k, v in expected.items():
        if tuple(given[k].shape) != tuple(v.shape):
            raise CheckpointError(f"{path}: {k} has shape {tuple(given[k].shape)}, expected {tuple(v.shape)}")
    model.load_state_dict(given, strict=False)


def load_inception(weights=None, device="cpu", progress: bool = True) -> FIDInceptionV3:
    """The FID Inception with weights from a local file (torch-fidelity's or pytorch-fid's .pth, or .safetensors),
    or, without one, torch-fidelity's file fetched into torch's hub cache on first use."""
    if weights is None:
        path = fetch_inception_weights(progress=progress)
    else:
        path = Path(os.path.expanduser(os.fspath(weights)))
        if not path.is_file():
            raise DitError(f"Inception weights {path} not found; download {INCEPTION_WEIGHTS_FILE} from "
                           f"{INCEPTION_WEIGHTS_URL}, or leave out --weights to fetch it into torch's hub cache")
        note_other_weights(path)
    model = FIDInceptionV3()
    load_state_dict_checked(model, path, _read_state_dict(path))
    return model.to(device).eval().requires_grad_(False)
