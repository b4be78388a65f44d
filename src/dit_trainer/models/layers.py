"""The few vision-transformer layers DiT borrows from timm, written here so that no
torchvision/timm install is needed. Attribute names match timm's so that checkpoints of the
original DiT release (`x_embedder.proj`, `attn.qkv`, `mlp.fc1`, ...) load unchanged."""

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from dit_trainer.models.attention import attention
from dit_trainer.models.rope import apply_rope, rope_cos_sin_2d


class PatchEmbed(nn.Module):
    """Image to patch tokens: a strided convolution, then (B, N, D)."""

    def __init__(self, img_size=32, patch_size=2, in_chans=4, embed_dim=768, bias=True):
        super().__init__()
        self.img_size = (img_size, img_size)
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, x):
        if x.shape[-2:] != self.img_size:
            raise ValueError(f"input is {tuple(x.shape[-2:])} but the model was built for {self.img_size}")
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention with a fused `qkv` projection laid out [q | k | v].

    Options (off in the release): `qk_norm` RMS-normalises each head of q and of k (a learned
    weight per channel of a head, shared by the heads); `rope_grid` > 0 rotates q and k by 2-D
    axial RoPE over a rope_grid x rope_grid token grid. Neither adds a parameter to the projections.
    """

    def __init__(self, dim, num_heads=8, qkv_bias=True, qk_norm=False, rope_grid=0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.qk_norm, self.rope_grid = bool(qk_norm), rope_grid
        if qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        if rope_grid:
            # Non-persistent: state dicts stay the projections' alone; every pipeline stage has them.
            cos, sin = rope_cos_sin_2d(self.head_dim, rope_grid)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x, positions=None):
        """`positions` (B, N): the token indices of x when it holds a routed subset (RoPE reads them)."""
        if self.qk_norm or self.rope_grid:
            return self.proj(self._attend_with_options(x, positions))
        B, N, _ = x.shape
        # The head count is read from the tensor, not `num_heads`: under tensor parallelism each
        # rank holds only its own heads of q, k and v.
        qkv = self.qkv(x).reshape(B, N, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = attention(q, k, v)
        x = x.transpose(1, 2).reshape(B, N, -1)
        return self.proj(x)

    def _attend_with_options(self, x, positions=None):
        # (B, N, H, D) per head, the layout the norms and apply_rope take; the release's path above
        # is kept apart so that its kernels (and bits) stay the same.
        q, k, v = self.qkv(x).unflatten(-1, (3, -1, self.head_dim)).unbind(2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope_grid:
            cos, sin = self.rope_cos, self.rope_sin
            if positions is not None:  # routed tokens keep their own places' rotation
                cos, sin = cos[positions], sin[positions]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2).flatten(2)


# 2 * sqrt(2 / pi): 0.5 * (1 + tanh(z)) is sigmoid(2z).
_SIGMOID_GELU_SCALE = 2.0 * math.sqrt(2.0 / math.pi)


def gelu_tanh_as_sigmoid(x):
    """GELU's tanh approximation written as x * sigmoid(2z): the same function, other rounding."""
    xf = x.float()
    return (xf * torch.sigmoid(_SIGMOID_GELU_SCALE * (xf + 0.044715 * xf * xf * xf))).to(x.dtype)


class TanhGELU(nn.Module):
    """nn.GELU(approximate="tanh") with a faster form for compiled graphs.

    Inductor's CPU code for tanh made GELU the costliest kernel after the matmuls; written with a
    sigmoid it fuses into cheaper code. Eager keeps PyTorch's one fused kernel, which the sigmoid
    form's several ops would lose to. No parameters, so state dicts are unchanged.
    """

    def forward(self, x):
        if torch.compiler.is_compiling():
            return gelu_tanh_as_sigmoid(x)
        return nn.functional.gelu(x, approximate="tanh")


class Mlp(nn.Module):
    """Two-layer MLP with tanh-approximated GELU, as in DiT (and PixArt's caption projection, whose
    `out_features` differ from its input's)."""

    def __init__(self, in_features, hidden_features, out_features=None):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = TanhGELU()
        self.fc2 = nn.Linear(hidden_features, out_features or in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class FeedForward(nn.Module):
    """SwiGLU, w2(silu(w1 x) * w3 x) without biases: Large-DiT's feed-forward and DiT's `model.mlp swiglu`."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def block_norm(kind: str, dim: int, eps: float = 1e-6) -> nn.Module:
    """The norm before attention, MLP and head: the release's LayerNorm without affine, or an RMSNorm
    with a learned scale (`model.norm rmsnorm`, as LightningDiT's), both of this eps."""
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    if kind == "layernorm":
        return nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
    raise ValueError(f"norm {kind!r} is not layernorm or rmsnorm")


def timestep_embedding(t, dim, max_period=10000, freq_shift=0):
    """Sinusoidal embedding of (possibly fractional) timesteps, cos half first as in DiT.

    `freq_shift=1` spaces the frequencies over half - 1, as diffusers' port of DiT does.
    """
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / (half - freq_shift)).to(t.device)
    args = t[:, None].float() * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


def _sincos_1d(embed_dim, pos):
    omega = np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0)
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def get_2d_sincos_pos_embed(embed_dim, grid_size, interpolation_scale=1.0):
    """Fixed 2-D sin-cos position embedding (grid_size**2, embed_dim), MAE's float64 recipe; positions
    are arange(grid_size) / interpolation_scale (PixArt's scale for grids larger than it started on)."""
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    if interpolation_scale != 1:
        grid_h = grid_h / np.float32(interpolation_scale)
        grid_w = grid_w / np.float32(interpolation_scale)
    # meshgrid(w, h): the first half of the channels encodes the column, as in the release.
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape(2, 1, grid_size, grid_size)
    emb_h = _sincos_1d(embed_dim // 2, grid[0])
    emb_w = _sincos_1d(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


def init_backbone(model, interpolation_scale=1.0) -> None:
    """The release's first initialisation of a DiT-like `model` (DiT, PixArt), in its order: Xavier-uniform
    linears with zero biases, the fixed sin-cos `pos_embed`, and the patch conv like a linear layer over
    its flattened kernel."""

    def _basic_init(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.constant_(module.bias, 0)

    model.apply(_basic_init)
    grid = int(model.x_embedder.num_patches**0.5)
    pos_embed = get_2d_sincos_pos_embed(model.pos_embed.shape[-1], grid, interpolation_scale)
    model.pos_embed.data.copy_(torch.from_numpy(pos_embed).float().unsqueeze(0))
    w = model.x_embedder.proj.weight.data
    nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
    nn.init.constant_(model.x_embedder.proj.bias, 0)


def unpatchify(x, patch_size: int, channels: int):
    """(B, N, p*p*C) tokens, features ordered (p, p, C), back to (B, C, H, W) images."""
    p, c = patch_size, channels
    h = w = int(x.shape[1] ** 0.5)
    x = x.reshape(x.shape[0], h, w, p, p, c)
    x = torch.einsum("nhwpqc->nchpwq", x)
    return x.reshape(x.shape[0], c, h * p, w * p)


def set_io(model, input_size: int, patch_size: int, in_channels: int, num_classes: int, learn_sigma: bool) -> None:
    """The attributes every family's model exposes to the trainer, sampling and the converters (its
    input's side and channels, the classes, whether a variance half follows the prediction)."""
    if input_size % patch_size:
        raise ValueError(f"input_size {input_size} is not divisible by patch_size {patch_size}")
    model.input_size, model.patch_size, model.in_channels = input_size, patch_size, in_channels
    model.num_classes, model.learn_sigma = num_classes, learn_sigma
    model.out_channels = in_channels * 2 if learn_sigma else in_channels
