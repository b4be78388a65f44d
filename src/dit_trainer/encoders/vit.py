"""DINOv2's vision transformer (facebookresearch/dinov2's DinoVisionTransformer at inference), frozen.

Parameter names follow the official torch-hub checkpoints (`patch_embed.proj`, `blocks.N.attn.qkv`,
`blocks.N.ls1.gamma`, `register_tokens`, ...) so those files load with `load_state_dict(strict=True)`.
Only the inference path is here: no drop path, no masking, no nested tensors.
"""

import math
import torch
import torch.nn as nn
import torch.nn.functional as F

from dit_trainer.encoders.shape import VitShape, swiglu_hidden


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    """fc1 → GELU (erf) → fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class SwiGLU(nn.Module):
    """ViT-g's FFN: one fused w12 projection split into gate and value, silu(gate) · value → w3."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden)
        self.w3 = nn.Linear(hidden, dim)

    def forward(self, x):
        gate, value = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * value)


class LayerScale(nn.Module):
    """Per-channel residual-branch scale (dinov2's `gamma`)."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block with layer scale on both residual branches."""

    def __init__(self, shape: VitShape):
        super().__init__()
        dim = shape.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, shape.num_heads)
        self.ls1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        if shape.swiglu:
            self.mlp = SwiGLU(dim, swiglu_hidden(dim, shape.mlp_ratio))
        else:
            self.mlp = Mlp(dim, int(dim * shape.mlp_ratio))
        self.ls2 = LayerScale(dim)

    def forward(self, x):
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """Non-overlapping patch_size² convolution, flattened to (B, N, D)."""

    def __init__(self, shape: VitShape):
        super().__init__()
        self.proj = nn.Conv2d(shape.in_chans, shape.embed_dim, shape.patch_size, stride=shape.patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class DinoViT(nn.Module):
    """The DINOv2 backbone: patch tokens, a class token, optional register tokens, a final LayerNorm."""

    def __init__(self, shape: VitShape):
        super().__init__()
        self.shape = shape
        self.embed_dim = shape.embed_dim
        self.patch_size = shape.patch_size
        self.num_register_tokens = shape.num_register_tokens
        grid = shape.img_size // shape.patch_size
        dim = shape.embed_dim
        self.patch_embed = PatchEmbed(shape)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid + 1, dim))
        if shape.num_register_tokens:
            self.register_tokens = nn.Parameter(torch.zeros(1, shape.num_register_tokens, dim))
        else:
            self.register_tokens = None
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        # Unused at inference; kept so the official checkpoints load strictly.
        self.mask_token = nn.Parameter(torch.zeros(1, dim))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """dinov2's init: truncated-normal linears and position embedding, near-zero class/register tokens."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        if self.register_tokens is not None:
            nn.init.normal_(self.register_tokens, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def interpolate_pos_encoding(self, height: int, width: int) -> torch.Tensor:
        """The position embedding (1, 1 + n_h·n_w, D) for an image of height×width pixels."""
        n_h, n_w = height // self.patch_size, width // self.patch_size
        count = self.pos_embed.shape[1] - 1
        if n_h * n_w == count and n_h == n_w:
            return self.pos_embed
        grid = int(math.sqrt(count))
        dim = self.pos_embed.shape[-1]
        pos = self.pos_embed.float()
        patch = pos[:, 1:].reshape(1, grid, grid, dim).permute(0, 3, 1, 2)
        if self.shape.interpolate_offset:
            # A scale factor, not a size: F.interpolate maps coordinates by the factor given, which is
            # what the checkpoints' reference outputs were computed with.
            offset = self.shape.interpolate_offset
            kwargs = {"scale_factor": ((n_h + offset) / grid, (n_w + offset) / grid)}
        else:
            kwargs = {"size": (n_h, n_w)}
        patch = F.interpolate(patch, mode="bicubic", antialias=self.shape.interpolate_antialias, **kwargs)
        if patch.shape[-2:] != (n_h, n_w):
            raise ValueError(f"position embedding resampled to {tuple(patch.shape[-2:])}, expected {(n_h, n_w)}")
        patch = patch.permute(0, 2, 3, 1).reshape(1, n_h * n_w, dim)
        return torch.cat([pos[:, :1], patch], dim=1).to(self.pos_embed.dtype)

    def prepare_tokens(self, x):
        """Class token, register tokens, then patch tokens, with position embeddings on class and patches."""
        b, _, h, w = x.shape
        x = self.patch_embed(x)
        # No casts: under autocast the float32 tokens promote the patch embedding's bf16 output, so the
        # residual stream stays float32 as in dinov2.
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)
        x = x + self.interpolate_pos_encoding(h, w)
        if self.register_tokens is not None:
            x = torch.cat([x[:, :1], self.register_tokens.expand(b, -1, -1), x[:, 1:]], dim=1)
        return x

    def forward_features(self, x) -> dict:
        """dinov2's forward_features dict: x_norm_clstoken, x_norm_regtokens, x_norm_patchtokens, x_prenorm, masks."""
        x = self.prepare_tokens(x)
        for block in self.blocks:
            x = block(x)
        x_norm = self.norm(x)
        r = self.num_register_tokens
        return {
            "x_norm_clstoken": x_norm[:, 0],
            "x_norm_regtokens": x_norm[:, 1:r + 1],
            "x_norm_patchtokens": x_norm[:, r + 1:],
            "x_prenorm": x,
            "masks": None,
        }

    def forward(self, x):
        """The normalised class token, as dinov2's model without a head returns."""
        return self.forward_features(x)["x_norm_clstoken"]
