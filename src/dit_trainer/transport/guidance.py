"""Classifier-free guidance as a model function for the transport samplers.

The batch holds the conditional half first and the null-label half second, as the release's
`sample.py` builds it. Guidance is applied to every output channel (the release's SiT guides only
the first three, a choice kept for exact reproduction of its FIDs), and optionally only for t in a
`guidance interval` [lo, hi] (Kynkäänniemi et al., 2024): outside it the unconditional pass is
skipped and both halves receive the conditional prediction.
"""

import torch

from dit_trainer.errors import ConfigError


def cfg_model_fn(model, cfg_scale, interval=None, cfg_channels="all"):
    """model_fn(x, t, y) that guides `model.forward_with_cfg` with `cfg_scale`.

    `interval=(lo, hi)` in the transport's time (0 noise, 1 data) limits guidance to lo <= t <= hi.
    `cfg_channels`: "all" (every channel of x), "release" (the model's own default) or an int.
    """
    if interval is not None:
        lo, hi = (float(v) for v in interval)
        if not 0 <= lo <= hi <= 1:
            raise ConfigError(f"guidance interval must satisfy 0 <= lo <= hi <= 1, got {interval!r}")

    def guided(x, t, y, **kwargs):
        if cfg_channels == "release":
            channel_kw = {}
        elif cfg_channels == "all":
            channel_kw = {"cfg_channels": x.shape[1]}
        else:
            channel_kw = {"cfg_channels": int(cfg_channels)}
        if interval is None:
            return model.forward_with_cfg(x, t, y, cfg_scale, **channel_kw, **kwargs)
        inside = (t >= lo) & (t <= hi)
        if bool(inside.all()):
            return model.forward_with_cfg(x, t, y, cfg_scale, **channel_kw, **kwargs)
        half = len(x) // 2
        cond = model(x[:half], t[:half], y[:half], **kwargs)
        if not bool(inside.any()):
            return torch.cat([cond, cond], dim=0)
        # Mixed times in one batch (not produced by the samplers here): blend per sample.
        guided_out = model.forward_with_cfg(x, t, y, cfg_scale, **channel_kw, **kwargs)
        mask = inside.view(-1, *([1] * (x.dim() - 1)))
        return torch.where(mask, guided_out, torch.cat([cond, cond], dim=0))

    return guided
