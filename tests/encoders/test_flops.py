"""encoder_flops against PyTorch's FLOP counter; parameter counts and bytes from a name equal the built model's."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from dit_trainer.encoders import build_encoder, encoder_flops, encoder_param_bytes, encoder_param_count
from tests.encoders.encoder_helpers import tiny_encoder


@pytest.mark.parametrize("name, size", [("dinov2_vitb14", 56), ("dinov2_vitg14_reg", 112)])
def test_forward_flops_match_the_flop_counter(name, size):
    encoder = tiny_encoder(name)
    x = torch.randn(1, 3, size, size)
    # The math backend writes attention as matmuls the counter sees; the CPU flash kernel is not counted.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        encoder.forward_features(x)
    assert encoder_flops(encoder, size) == counter.get_total_flops()


def test_a_name_counts_like_the_built_encoder():
    encoder = build_encoder("dinov2_vits14")
    assert encoder_flops("dinov2_vits14", 224) == encoder_flops(encoder, 224)
    assert encoder_param_count("dinov2_vits14") == sum(p.numel() for p in encoder.parameters())
    assert encoder_param_bytes("dinov2_vits14") == sum(t.numel() * 4 for t in encoder.state_dict().values())
    assert encoder_param_bytes(encoder, torch.bfloat16) * 2 == encoder_param_bytes(encoder)
    assert encoder_param_bytes(encoder.to(torch.bfloat16)) * 2 == encoder_param_bytes("dinov2_vits14")


def test_flops_grow_with_size_and_model():
    assert encoder_flops("dinov2_vitb14", 448) > 4 * encoder_flops("dinov2_vitb14", 224)
    assert encoder_flops("dinov2_vitg14", 224) > encoder_flops("dinov2_vitl14", 224) > encoder_flops("dinov2_vitb14", 224)
