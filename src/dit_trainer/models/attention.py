"""Softmax attention, softmax(q kᵀ / √d) v, with the kernel chosen by device and dtype.

On CUDA and for fp32, PyTorch's fused SDPA is the fastest path. For bf16/fp16 on CPU it is not:
at DiT's sizes (256 tokens, head dim 64) the CPU flash kernel, forward plus backward, runs at
about half the speed of the same work done as batched matmuls (the CPU's bf16 matmul units are
its fast path).
Plain matmul attention would keep the (B, H, N, N) probabilities for the backward, though, which
is more memory than every weight of DiT-S/2; so `MatmulAttention` saves only q, k and v (a flash
kernel keeps about as much: those, its output and a row log-sum-exp) and recomputes the
probabilities in the backward. That holds in eager; a compiled graph sees the backward's scores
equal the forward's, merges them and keeps the probabilities, unless the trainer's activation
budget (`train.activation_memory_budget` 0.6 or lower at DiT-S/2) makes it recompute them.
"""

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# The SDPA kernels a Jacobian-vector product may go through: the fused ones have no forward-mode
# derivative, SDPA's math kernel has (equal to hand-written attention to 1e-6); on a GPU,
# benchmarks/gpu_check.sh measures which fused kernel, if any, takes a JVP and how fast.
FORWARD_AD_BACKENDS = (SDPBackend.MATH,)
_forward_ad = False  # inside forward_ad_attention(): no custom autograd Function, SDPA's math kernel


class MatmulAttention(torch.autograd.Function):
    """Attention from batched matmuls with a flash kernel's memory: only q, k and v are saved;
    the backward recomputes the probabilities (one q kᵀ matmul and a softmax)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, mask=None):
        probs = torch.softmax(_masked(torch.matmul(q * scale, k.transpose(-2, -1)), mask), dim=-1)
        ctx.save_for_backward(q, k, v, mask)
        ctx.scale = scale
        return torch.matmul(probs, v)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, mask = ctx.saved_tensors
        q_scaled = q * ctx.scale
        probs = torch.softmax(_masked(torch.matmul(q_scaled, k.transpose(-2, -1)), mask), dim=-1)
        grad_out = grad_out.contiguous()
        grad_v = torch.matmul(probs.transpose(-2, -1), grad_out)
        grad_probs = torch.matmul(grad_out, v.transpose(-2, -1))
        # The softmax Jacobian applied without forming it: P * (dP - rowsum(dP * P)), one kernel.
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        grad_q = torch.matmul(grad_scores, k).mul_(ctx.scale)
        grad_k = torch.matmul(grad_scores.transpose(-2, -1), q_scaled)
        return grad_q, grad_k, grad_v, None, None


def _masked(scores, mask):
    """Scores of the keys `mask` leaves out (False) at -inf, so softmax gives them no weight."""
    return scores if mask is None else scores.masked_fill(~mask, float("-inf"))


def use_matmul_kernel(q: torch.Tensor) -> bool:
    """True where `MatmulAttention` beats fused SDPA: reduced precision on CPU."""
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)


@contextlib.contextmanager
def forward_ad_attention():
    """Attention that forward-mode AD (torch.func.jvp) differentiates: FORWARD_AD_BACKENDS' SDPA kernels, and
    not `MatmulAttention`, which has a backward only."""
    global _forward_ad
    was = _forward_ad
    _forward_ad = True
    try:
        with sdpa_kernel(list(FORWARD_AD_BACKENDS)):
            yield
    finally:
        _forward_ad = was


def attention(q, k, v, enable_gqa=False, mask=None):
    """softmax(q kᵀ/√d) v over (B, H, N, d) tensors; GQA repeats kv heads as SDPA does. `mask`: a
    boolean tensor broadcasting to (B, H, N, M), False for keys a query must not see (a caption's padding)."""
    if _forward_ad or not use_matmul_kernel(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)
    if enable_gqa and k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return MatmulAttention.apply(q, k, v, q.shape[-1] ** -0.5, mask)
