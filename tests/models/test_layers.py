"""The shared layers: the compiled GELU form is the same function as the eager one."""

import torch
import torch.nn.functional as F

from dit_trainer.models import layers


def test_sigmoid_form_is_the_tanh_approximation():
    x = torch.cat([torch.linspace(-30, 30, 20001, dtype=torch.float64), torch.tensor([-1e4, 1e4], dtype=torch.float64)])
    ours = layers.gelu_tanh_as_sigmoid(x.float()).double()
    ref = F.gelu(x, approximate="tanh")
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(ours).all()


def test_bf16_input_keeps_dtype_and_rounds_like_the_kernel():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ours = layers.gelu_tanh_as_sigmoid(x)
    assert ours.dtype == torch.bfloat16
    ref = F.gelu(x.float(), approximate="tanh")
    # Computed in fp32 and rounded once: within one bf16 step of the exact value.
    assert ((ours.float() - ref).abs() <= ref.abs() * 2**-8 + 1e-30).all()


def test_compiled_graph_takes_the_sigmoid_form(monkeypatch):
    calls = []
    real = layers.gelu_tanh_as_sigmoid

    def counted(x):
        calls.append(torch.compiler.is_compiling())
        return real(x)

    monkeypatch.setattr(layers, "gelu_tanh_as_sigmoid", counted)
    act = layers.TanhGELU()
    x = torch.randn(8, 16)
    eager = act(x)
    assert calls == []
    torch._dynamo.reset()
    compiled = torch.compile(act, backend="eager")(x)
    assert calls and all(calls)
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)


def test_mlp_state_dict_names_are_the_release_ones():
    assert sorted(layers.Mlp(4, 8).state_dict()) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
