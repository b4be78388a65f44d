"""Rotary position embedding (RoPE) on queries and keys, shared by the families that use it.

Large-DiT rotates by the 1-D index of a token in the flattened patch grid, as its release does;
DiT and SiT (`model.rope`) rotate axially in 2-D: the first half of each head's channel pairs by
the token's row, the second half by its column, with integer grid positions (LightningDiT's
layout at its training resolution). Both apply the same rotation to adjacent channel pairs.
"""

import torch


def _inv_freq(width: int, theta: float, device=None):
    # LLaMA's frequencies: theta^(-2i/width) for the width // 2 channel pairs.
    return 1.0 / (theta ** (torch.arange(0, width, 2, device=device)[: width // 2].float() / width))


def rope_cos_sin(head_dim: int, n_tokens: int, theta: float = 10000.0, device=None):
    """cos and sin of LLaMA's rotary angles, (n_tokens, head_dim // 2) each, in float32."""
    angles = torch.outer(torch.arange(n_tokens, device=device).float(), _inv_freq(head_dim, theta, device))
    return angles.cos(), angles.sin()


def rope_cos_sin_2d(head_dim: int, grid: int, theta: float = 10000.0, device=None):
    """cos and sin of 2-D axial rotary angles for a grid x grid of tokens in row-major order,
    (grid**2, head_dim // 2) each, in float32: pairs [0, head_dim/4) turn with the row, the rest
    with the column, each axis with the frequencies of a head_dim / 2 wide 1-D embedding."""
    if head_dim % 4:
        raise ValueError(f"2-D rotary embedding needs a head width divisible by 4, not {head_dim}")
    inv = _inv_freq(head_dim // 2, theta, device)
    pos = torch.arange(grid, device=device).float()
    rows = torch.outer(pos, inv)[:, None, :].expand(grid, grid, -1)
    cols = torch.outer(pos, inv)[None, :, :].expand(grid, grid, -1)
    angles = torch.cat([rows, cols], dim=-1).reshape(grid * grid, -1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate (B, T, H, D) by position; pairs are adjacent channels (2i, 2i+1), as in the release.

    The rotation runs in float32 whatever the activation dtype, as the release does, because
    bf16 angles lose the positions of far tokens. `cos` and `sin` are the table of positions
    (T', D/2), of which the first T apply, or each token's own rows (B, T, D/2) (routed tokens).
    """
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    if cos.dim() == 2:
        cos, sin = cos[: x.shape[1]], sin[: x.shape[1]]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)
