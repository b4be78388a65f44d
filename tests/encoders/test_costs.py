"""encoder_flops against PyTorch's FLOP counter; parameter counts and bytes against the built models."""

import subprocess
import sys

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


@pytest.mark.parametrize("name", ["dinov2_vits14", "dinov2_vitl14_reg", "dinov2_vitg14", "dinov2_vitg14_reg"])
def test_parameter_count_of_a_name_is_the_built_models(name):
    with torch.device("meta"):
        encoder = build_encoder(name)
    assert encoder_param_count(name) == sum(p.numel() for p in encoder.parameters())
    assert encoder_param_count(encoder) == encoder_param_count(name)


def test_bytes_and_flops_of_a_name():
    with torch.device("meta"):
        encoder = build_encoder("dinov2_vits14")
    assert encoder_flops("dinov2_vits14", 224) == encoder_flops(encoder, 224)
    assert encoder_param_bytes("dinov2_vits14") == sum(t.numel() * 4 for t in encoder.state_dict().values())
    assert encoder_param_bytes(encoder, torch.bfloat16) * 2 == encoder_param_bytes(encoder, "fp32")
    assert encoder_param_bytes(encoder, "bf16") == encoder_param_bytes(encoder, 2)
    assert encoder_flops("dinov2_vitb14", 448) > 4 * encoder_flops("dinov2_vitb14", 224)


def test_costs_do_not_import_torch():
    code = ("import sys\nfrom dit_trainer.encoders import encoder_flops, encoder_param_count\n"
            "assert encoder_flops('dinov2_vitg14', 224) > 0 and encoder_param_count('dinov2_vitb14') > 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
