"""Classifier-free guidance inside a model's forward, as DiT's `forward_with_cfg` does it; every
family on this interface (DiT, SiT, Large-DiT) guides the same way."""

import torch


def guided_forward(forward, x, t, y, cfg_scale, channels: int):
    """`forward` on a batch whose first half is conditional and second half unconditional (labels
    then null labels; only x's first half is read): the first `channels` output channels become
    uncond + cfg_scale (cond - uncond) in both halves, the rest (a learned sigma) pass through."""
    half = x[: len(x) // 2]
    out = forward(torch.cat([half, half], dim=0), t, y)
    eps, rest = out[:, :channels], out[:, channels:]
    cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
    half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
    return torch.cat([torch.cat([half_eps, half_eps], dim=0), rest], dim=1)
