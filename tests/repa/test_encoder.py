"""REPA's targets with nothing but `repa.enabled: true` are the release's (sihyun-yu/REPA): its
`load_encoders` and `preprocess_raw_image`, written out here independently, on 256 px images."""

import math

import pytest
import torch
import torch.nn.functional as F
from tests.encoders.encoder_helpers import tiny_encoder

from dit_trainer.config import build_config
from dit_trainer.encoders import SPECS
from dit_trainer.repa.encoder import AlignmentTargets, batch_images

# The four DINOv2 sizes at their real widths and stored 37x37 position table; one block keeps it cheap.
NAMES = [f"dinov2_vit{letter}14{reg}" for letter in "sblg" for reg in ("", "_reg")]
GRID = 16  # a /2 model's tokens per side on 256 px images (32x32 latents)


def _dinov2(name, seed):
    """A one-block encoder `name` at its real width with every tensor random, in dinov2's own convention."""
    spec = SPECS[name]
    return tiny_encoder(name, seed=seed, embed_dim=spec.embed_dim, num_heads=spec.num_heads, depth=1,
                        img_size=spec.img_size)


def release_targets(model, images_uint8):
    """The release's pipeline: `load_encoders` replaces pos_embed once by timm's resample_abs_pos_embed to
    16x16 (float32, bicubic to the size, antialiased), `preprocess_raw_image` divides by 255, normalises
    with ImageNet's statistics and resizes to 224 (plain bicubic), and the targets are the final-norm
    patch tokens of forward_features."""
    pos = model.pos_embed.detach()
    old = math.isqrt(pos.shape[1] - 1)
    table = pos[:, 1:].float().reshape(1, old, old, -1).permute(0, 3, 1, 2)
    table = F.interpolate(table, size=[GRID, GRID], mode="bicubic", antialias=True)
    model.pos_embed = torch.nn.Parameter(torch.cat([pos[:, :1], table.permute(0, 2, 3, 1).reshape(1, GRID * GRID, -1)],
                                                   dim=1).to(pos.dtype), requires_grad=False)
    x = images_uint8 / 255.
    mean = torch.tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    x = F.interpolate((x - mean) / std, 224 * (x.shape[-1] // 256), mode="bicubic")
    with torch.no_grad():
        return model.forward_features(x)["x_norm_patchtokens"]


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("name", NAMES)
def test_defaults_give_the_release_targets(tmp_path, name):
    source = _dinov2(name, seed=NAMES.index(name))
    torch.save(source.state_dict(), tmp_path / "hub.pth")  # as the torch-hub file the release loads
    images = torch.randint(0, 256, (1, 3, 256, 256), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    want = release_targets(source, images)
    # Nothing but the encoder, its weights and its depth (to load the one-block file) is set.
    r = build_config({"repa": {"enabled": True, "encoder": name, "encoder_weights": str(tmp_path / "hub.pth"),
                               "encoder_overrides": {"depth": 1}}}).repa
    targets = AlignmentTargets(r, GRID, "cpu")
    assert targets.encoder.pos_embed.shape[1] == 1 + GRID * GRID  # resampled once, at build
    got = targets(batch_images({"image": images}, None, pixel_space=False))
    assert got.shape == want.shape == (1, GRID * GRID, SPECS[name].embed_dim)
    assert _rel(got, want) < 1e-6


def test_dinov2s_own_convention_differs_from_the_release():
    # What the test above guards against: the models without registers resampling by dinov2's rule.
    source = _dinov2("dinov2_vits14", seed=0)
    images = torch.randint(0, 256, (1, 3, 256, 256), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        own, _ = source.encode(images / 255., 224)
    assert _rel(own, release_targets(source, images)) > 1e-3
