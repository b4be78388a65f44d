"""Guidance: classifier-free guidance, autoguidance and the noise levels they act in.

Three ideas combine here, each as its paper defines it, on the network's output D (the predicted
noise or velocity: both are affine in the denoised image for a given x_t, so mixing them mixes D):

- classifier-free guidance (Ho & Salimans, 2022; DiT's `forward_with_cfg`):
  D_uncond + w_cfg (D_cond - D_uncond), the null label's prediction in the same batched call;
- autoguidance (Karras et al., 2024, arXiv 2406.02507): D_guide + w (D_cond - D_guide), the guide a
  smaller or less trained version of the model given the same label, in a call of its own;
- a guidance interval (Kynkaanniemi et al., 2024, arXiv 2404.07724): guide only where the noise level
  sigma lies in (sigma_lo, sigma_hi]; elsewhere the conditional prediction alone (one call fewer).

Together, both guidance terms are added to the conditional prediction:
D_cond + (w_cfg - 1)(D_cond - D_uncond) + (w - 1)(D_cond - D_guide), which is each of the above
when the other weight is 1. Sigma is `Objective.noise_level(t)`: the same unit for every schedule
and objective, so a paper's interval carries over once scaled by the two data's sigma_data
(docs/sampling.md: EDM2's latents have 0.5, ours 1, so its bounds double).
"""

import dataclasses
from typing import Optional

import torch

from dit_trainer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Guidance:
    """How samples are guided: weights, the guide model, the noise-level interval and the guided channels."""

    cfg_scale: float = 1.0  # classifier-free guidance weight (1: none)
    guide: Optional[object] = None  # autoguidance's guide: a model (x, t, y) -> output, or None
    guide_scale: float = 1.0  # autoguidance weight (1: none)
    interval: Optional[tuple] = None  # (sigma_lo, sigma_hi]: guide only there; None: every step
    cfg_channels: Optional[int] = None  # guide the first N output channels; None: the model's default

    def __post_init__(self):
        if self.guide is not None and self.guide_scale == 1.0:
            object.__setattr__(self, "guide", None)  # w = 1 is the main model alone: no guide call at all
        if self.guide is None:
            object.__setattr__(self, "guide_scale", 1.0)

    @property
    def doubled(self) -> bool:
        """Whether the batch holds the labels then as many null labels (classifier-free guidance)."""
        return float(self.cfg_scale) != 1.0

    @property
    def active(self) -> bool:
        """Whether any guidance applies."""
        return self.doubled or self.guide is not None


def _channels(model, guidance: Guidance) -> int:
    """The output channels guidance mixes: `cfg_channels`, else every predicted channel (a learned sigma passes through)."""
    return int(guidance.cfg_channels) if guidance.cfg_channels is not None else int(model.in_channels)


def _mix(cond, uncond, guide, guidance: Guidance, channels: int):
    """The guided prediction from the conditional one and whichever of uncond / guide is there."""
    out = cond.clone()
    c = cond[:, :channels]
    mixed = c.clone()
    if uncond is not None:
        mixed = mixed + (float(guidance.cfg_scale) - 1.0) * (c - uncond[:, :channels])
    if guide is not None:
        g = guide[:, :channels].to(c.dtype)
        mixed = mixed + (float(guidance.guide_scale) - 1.0) * (c - g)
    out[:, :channels] = mixed
    return out


def guided_call(model, guidance: Guidance, x, t, y, counter=None, **kwargs):
    """One guided evaluation at every sample of the batch (the guidance interval left to the caller).

    With classifier-free guidance the batch is [x; x] with [labels; null labels] and the result holds the
    guided prediction in both halves, as the release's `forward_with_cfg`; otherwise the batch is as given."""
    channel_kw = {} if guidance.cfg_channels is None else {"cfg_channels": int(guidance.cfg_channels)}
    if guidance.doubled and guidance.guide is None:
        _count(counter, 2)
        return model.forward_with_cfg(x, t, y, cfg_scale=float(guidance.cfg_scale), **channel_kw)  # the release's arithmetic
    channels = _channels(model, guidance)
    if not guidance.doubled:
        cond = model(x, t, y, **kwargs)
        _count(counter, 2)
        return _mix(cond, None, guidance.guide(x, t, y), guidance, channels)
    # Both: the conditional and null-label passes in one batched call, the guide in its own.
    half = len(x) // 2
    out = model(x, t, y, **kwargs)
    cond, uncond = out[:half], out[half:]
    guide = guidance.guide(x[:half], t[:half], y[:half])
    _count(counter, 3)
    mixed = _mix(cond, uncond, guide, guidance, channels)
    # Both halves get the guided prediction; the second half keeps its own extra channels, as forward_with_cfg.
    return torch.cat([mixed, torch.cat([mixed[:, :channels], uncond[:, channels:]], dim=1)], dim=0)


def _count(counter, evaluations: int) -> None:
    # Network evaluations per sample: what sampling cost is compared by (NFE).
    if counter is not None:
        counter["nfe"] = counter.get("nfe", 0) + evaluations


def guided_model_fn(model, guidance: Guidance, objective=None, counter=None):
    """model_fn(x, t, y, **kwargs) for the objective's sampler: guided as `guidance` says.

    `counter`, a dict, gets "nfe": network evaluations per sample so far (a conditional pass counts 1, a
    null-label pass 1, a guide pass 1). Outside `guidance.interval` (needs `objective`) only the
    conditional pass runs; its prediction fills both halves of a doubled batch."""
    if guidance.interval is not None and objective is None:
        raise ConfigError("a guidance interval needs the objective whose noise levels it is in; pass objective=")
    if not guidance.active:
        def plain(x, t, y, **kwargs):
            _count(counter, 1)
            return model(x, t, y, **kwargs)

        return plain
    lo, hi = guidance.interval if guidance.interval is not None else (None, None)

    def guided(x, t, y, **kwargs):
        if lo is None:
            return guided_call(model, guidance, x, t, y, counter, **kwargs)
        sigma = objective.noise_level(t)
        inside = ((sigma > lo) & (sigma <= hi)).to(x.device)
        if bool(inside.all()):
            return guided_call(model, guidance, x, t, y, counter, **kwargs)
        half = len(x) // 2 if guidance.doubled else len(x)
        cond = model(x[:half], t[:half], y[:half], **kwargs)
        plain = torch.cat([cond, cond]) if guidance.doubled else cond
        if not bool(inside.any()):
            _count(counter, 1)
            return plain
        # Mixed noise levels in one batch (the samplers here never make one): blend per sample.
        full = guided_call(model, guidance, x, t, y, counter, **kwargs)
        return torch.where(inside.view(-1, *([1] * (x.dim() - 1))), full, plain)

    return guided
