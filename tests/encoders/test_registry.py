"""The encoder names, their shapes, where their weights live, and build_encoder's overrides."""

import pytest

from dit_trainer.encoders import SPECS, build_encoder, encoder_names, hf_id, shape_of, torch_hub_url
from dit_trainer.errors import ConfigError


def test_names_cover_four_sizes_with_and_without_registers():
    names = encoder_names()
    assert len(names) == 8 and all(f"{n}_reg" in names for n in names if not n.endswith("_reg"))
    for name in names:
        shape = SPECS[name]
        assert shape.patch_size == 14 and shape.img_size == 518
        assert shape.num_register_tokens == (4 if name.endswith("_reg") else 0)
        assert shape.swiglu == ("vitg" in name)
        # dinov2's hub entry points: the models with registers resample with antialias and no offset
        assert (shape.interpolate_offset, shape.interpolate_antialias) == ((0.0, True) if name.endswith("_reg")
                                                                           else (0.1, False))


def test_where_weights_are_published():
    assert torch_hub_url("dinov2_vitb14").endswith("/dinov2_vitb14/dinov2_vitb14_pretrain.pth")
    assert torch_hub_url("dinov2_vitg14_reg").endswith("/dinov2_vitg14/dinov2_vitg14_reg4_pretrain.pth")
    assert hf_id("dinov2_vitl14") == "facebook/dinov2-large"
    assert hf_id("dinov2_vits14_reg") == "facebook/dinov2-with-registers-small"


def test_overrides_give_a_small_encoder_of_the_same_kind():
    encoder = build_encoder("dinov2_vitg14_reg", embed_dim=24, depth=1, num_heads=2, img_size=28)
    assert encoder.embed_dim == 24 and len(encoder.blocks) == 1 and encoder.num_register_tokens == 4
    assert hasattr(encoder.blocks[0].mlp, "w12") and encoder.pos_embed.shape == (1, 5, 24)


@pytest.mark.parametrize("name, overrides, match", [
    ("dinov2_vitx14", {}, "unknown encoder 'dinov2_vitx14'"),
    ("dinov2_vitb14", {"width": 3}, "unknown encoder override 'width'"),
    ("dinov2_vitb14", {"num_heads": 5}, "not divisible by num_heads 5"),
])
def test_bad_names_and_overrides_are_one_line(name, overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        shape_of(name, **overrides)
    assert "\n" not in str(err.value)
