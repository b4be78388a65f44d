"""The position embedding's resampling: dinov2's two conventions, and REPA's resample-once-at-load."""

import torch
import torch.nn.functional as F

from dit_trainer.encoders import REPA_POS_RESAMPLE
from tests.encoders.encoder_helpers import tiny_encoder


def resampled_once(encoder, grid):
    """REPA's load step: pos_embed replaced by its bicubic, antialiased resampling to grid² (timm's
    resample_abs_pos_embed), so that the forward at grid·14 px uses it as it is."""
    pos = encoder.pos_embed.detach()
    old = int((pos.shape[1] - 1) ** 0.5)
    patch = pos[:, 1:].reshape(1, old, old, -1).permute(0, 3, 1, 2)
    patch = F.interpolate(patch, size=(grid, grid), mode="bicubic", antialias=True)
    return torch.cat([pos[:, :1], patch.permute(0, 2, 3, 1).reshape(1, grid * grid, -1)], dim=1)


def test_native_grid_is_not_resampled():
    encoder = tiny_encoder()
    assert encoder.interpolate_pos_encoding(56, 56) is encoder.pos_embed


def test_repa_convention_equals_resampling_once_at_load():
    encoder = tiny_encoder("dinov2_vitb14", **REPA_POS_RESAMPLE)
    assert torch.equal(encoder.interpolate_pos_encoding(224, 224), resampled_once(encoder, 16))
    # dinov2's own convention for the models without registers differs from it
    plain = tiny_encoder("dinov2_vitb14")
    assert not torch.allclose(plain.interpolate_pos_encoding(224, 224), resampled_once(plain, 16), atol=1e-3)
    # and for the _reg models the two coincide
    reg = tiny_encoder("dinov2_vitb14_reg")
    assert torch.equal(reg.interpolate_pos_encoding(224, 224), resampled_once(reg, 16))


def test_offset_convention_scales_by_n_plus_offset_over_the_grid():
    encoder = tiny_encoder("dinov2_vits14")  # stored grid 4 (56 px)
    pos = encoder.pos_embed.detach()
    patch = pos[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    expected = F.interpolate(patch, scale_factor=(10.1 / 4, 7.1 / 4), mode="bicubic")
    got = encoder.interpolate_pos_encoding(140, 98)
    assert got.shape == (1, 1 + 70, encoder.embed_dim)
    assert torch.equal(got[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 70, -1))
