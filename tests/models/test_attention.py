"""The CPU reduced-precision attention kernel against PyTorch's SDPA."""

import torch
import torch.nn.functional as F

from dit_trainer.models.attention import MatmulAttention, attention, use_matmul_kernel


def _qkv(shape, dtype, seed=0, heads_kv=None):
    g = torch.Generator().manual_seed(seed)
    b, h, n, d = shape
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    kv_shape = (b, heads_kv or h, n, d)
    k, v = (torch.randn(kv_shape, generator=g, dtype=torch.float64) for _ in range(2))
    return [t.to(dtype).requires_grad_() for t in (q, 2 * k, v)]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_gradients_are_exact_in_float64():
    q, k, v = _qkv((2, 3, 12, 8), torch.float64)
    assert torch.autograd.gradcheck(lambda q, k, v: MatmulAttention.apply(q, k, v, 8**-0.5), (q, k, v))


def test_float32_equals_sdpa_and_dispatch_keeps_sdpa():
    q, k, v = _qkv((2, 4, 40, 16), torch.float32)
    ours = MatmulAttention.apply(q, k, v, 16**-0.5)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert _rel(ours, ref) < 1e-5
    assert not use_matmul_kernel(q)
    assert torch.equal(attention(q, k, v), ref)  # fp32 on CPU stays on SDPA


def test_bf16_matches_fp32_reference_within_bf16_error():
    q, k, v = _qkv((2, 4, 64, 32), torch.bfloat16, heads_kv=2)
    assert use_matmul_kernel(q)
    grad = torch.randn(2, 4, 64, 32, generator=torch.Generator().manual_seed(1))
    out = attention(q, k, v, enable_gqa=True)
    grads = torch.autograd.grad(out, (q, k, v), grad.bfloat16())
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q32, k32, v32, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), grad)
    assert out.dtype == torch.bfloat16
    assert _rel(out, ref) < 2e-2
    for ours, want in zip(grads, ref_grads):
        assert ours.shape == want.shape  # kv grads come back per kv head under GQA
        assert _rel(ours, want) < 3e-2


def test_backward_keeps_no_token_by_token_matrix():
    n, d = 96, 16
    q, k, v = _qkv((2, 2, n, d), torch.bfloat16)
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attention(q, k, v)
    assert shapes, "nothing saved: the recording hook did not run"
    assert all(s[-2:] != (n, n) for s in shapes), shapes
