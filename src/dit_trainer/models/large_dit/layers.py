"""The LLaMA pieces of a DiT-LLaMA block: grouped-query attention with rotary positions and an
optional q/k LayerNorm, and the adaLN-Zero block around it and a SwiGLU feed-forward (rotary
tables and SwiGLU are `models/`' own, shared with DiT's block options).

Module and parameter names are those of Alpha-VLLM's Large-DiT-ImageNet release, so its
checkpoints load with `strict=True`. Nothing here needs apex, fairscale or flash-attn: RMSNorm
is torch's, attention is SDPA (which picks flash kernels on GPU itself).
"""

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate

from dit_trainer.models.attention import attention
from dit_trainer.models.dit.model import modulate
from dit_trainer.models.large_dit.sizes import swiglu_hidden
from dit_trainer.models.layers import FeedForward
from dit_trainer.models.rope import apply_rope, rope_cos_sin


class QKNorm(nn.LayerNorm):
    """The release's q/k LayerNorm: over all heads of a token at once, not per head.

    On a q or k that tensor parallelism shards by heads (a DTensor split on the last dim, with
    the weight and bias split alike) the statistics are reduced across shards: two all-reduces
    of one number per token instead of gathering the activation. On a plain tensor it is
    F.layer_norm.
    """

    def forward(self, x):
        if not isinstance(x, DTensor):
            return super().forward(x)
        xf, n = x.float(), x.shape[-1]
        # sum / n, not mean: a Partial(avg) cannot take the Partial(sum) gradient back.
        mean = _replicate_partial(xf.sum(-1, keepdim=True) / n)
        centred = xf - mean
        var = _replicate_partial(centred.pow(2).sum(-1, keepdim=True) / n)
        y = (centred * torch.rsqrt(var + self.eps)).type_as(x)
        return y * self.weight + self.bias


def _replicate_partial(t):
    # Left Partial, DTensor would redistribute the large sharded operand of the next op to match
    # it (and its backward cannot); all-reducing the small per-token statistic keeps q/k sharded.
    return t.redistribute(placements=[Replicate() if p.is_partial() else p for p in t.placements])


class Attention(nn.Module):
    """Bidirectional self-attention with RoPE, grouped kv heads and an optional q/k norm.

    Head counts are read from the projections' output at run time (`-1` in the views), so the
    same code runs on a tensor-parallel shard that holds only some of the heads.
    """

    def __init__(self, dim, n_heads, n_kv_heads=None, qk_norm=False, n_tokens=256, theta=10000.0):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.head_dim = dim // n_heads
        self.n_tokens, self.theta = n_tokens, theta
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        if qk_norm:
            self.q_norm = QKNorm(n_heads * self.head_dim)
            self.k_norm = QKNorm(self.n_kv_heads * self.head_dim)
        else:
            self.q_norm = self.k_norm = nn.Identity()
        # Non-persistent: not in checkpoints, yet every pipeline stage that holds this layer has them.
        cos, sin = rope_cos_sin(self.head_dim, n_tokens, theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def reset_rope(self):
        """Recompute the rotary tables in place (after building on `meta` and `to_empty`)."""
        cos, sin = rope_cos_sin(self.head_dim, self.n_tokens, self.theta, device=self.rope_cos.device)
        self.rope_cos, self.rope_sin = cos, sin

    def forward(self, x, positions=None):
        q = self.q_norm(self.wq(x)).unflatten(-1, (-1, self.head_dim))
        k = self.k_norm(self.wk(x)).unflatten(-1, (-1, self.head_dim))
        v = self.wv(x).unflatten(-1, (-1, self.head_dim))
        cos, sin = self.rope_cos, self.rope_sin
        if positions is not None:  # routed tokens (B, T): each keeps its own position's rotation
            cos, sin = cos[positions], sin[positions]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Query head i reads kv head i // (n_heads / n_kv_heads), the release's repeat order.
        out = attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=q.shape[2] != k.shape[2]
        )
        return self.wo(out.transpose(1, 2).flatten(2))


def cond_dim(dim):
    """Width of the conditioning vector c = t_emb + y_emb: the release caps it at 1024."""
    return min(dim, 1024)


class TransformerBlock(nn.Module):
    """Pre-norm LLaMA block (RMSNorm) with adaLN-Zero modulation from c."""

    def __init__(self, layer_id, dim, n_heads, n_kv_heads=None, multiple_of=256, ffn_dim_multiplier=None,
                 norm_eps=1e-5, qk_norm=False, n_tokens=256):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(dim, n_heads, n_kv_heads, qk_norm, n_tokens)
        self.feed_forward = FeedForward(dim, swiglu_hidden(dim, multiple_of, ffn_dim_multiplier))
        self.attention_norm = nn.RMSNorm(dim, eps=norm_eps)
        self.ffn_norm = nn.RMSNorm(dim, eps=norm_eps)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(cond_dim(dim), 6 * dim, bias=True))

    def forward(self, x, c, positions=None):
        """`positions` (B, T): the token indices of x when it holds a routed subset of the image's tokens."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        attn_in = modulate(self.attention_norm(x), shift_msa, scale_msa)
        x = x + gate_msa.unsqueeze(1) * self.attention(attn_in, positions)
        x = x + gate_mlp.unsqueeze(1) * self.feed_forward(modulate(self.ffn_norm(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    """adaLN-modulated LayerNorm, then a linear map from tokens to patches."""

    def __init__(self, dim, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(cond_dim(dim), 2 * dim, bias=True))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))
