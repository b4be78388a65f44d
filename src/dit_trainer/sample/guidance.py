"""Guidance: classifier-free guidance, autoguidance and the noise levels they act in.

Three ideas combine here, each as its paper defines it, on the network's output D (the predicted
noise or velocity: both are affine in the denoised image for a given x_t, so mixing them mixes D):

- classifier-free guidance (Ho & Salimans, 2022; DiT's `forward_with_cfg`):
  D_uncond + w_cfg (D_cond - D_uncond), the null label's (a null caption's, a negative prompt's)
  prediction in the same batched call;
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
    guide: Optional[object] = None  # autoguidance's guide: a model (x, t, **cond) -> output, or None
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
        """Whether the batch holds the conditional rows then as many unconditional ones (classifier-free guidance)."""
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


def _rows(cond: dict, n: int) -> dict:
    """The first `n` rows of every condition tensor (a doubled batch's conditional half)."""
    return {k: v[:n] for k, v in cond.items()}


def guided_call(model, guidance: Guidance, x, t, counter=None, **cond):
    """One guided evaluation at every sample of the batch (the guidance interval left to the caller).

    `cond` is the model's condition keywords (`y` labels, or a caption's `text_embeds`, `text_mask`, ...).
    With classifier-free guidance the batch is [x; x] with [conditional; unconditional] rows and the result
    holds the guided prediction in both halves, as the release's `forward_with_cfg`; otherwise the batch is
    as given. The guide gets the conditional rows' keywords, whatever the condition."""
    channel_kw = {} if guidance.cfg_channels is None else {"cfg_channels": int(guidance.cfg_channels)}
    if guidance.doubled and guidance.guide is None:
        _count(counter, 2)
        return model.forward_with_cfg(x, t, cfg_scale=float(guidance.cfg_scale), **channel_kw, **cond)  # the release's arithmetic
    channels = _channels(model, guidance)
    if not guidance.doubled:
        out = model(x, t, **cond)
        _count(counter, 2)
        return _mix(out, None, guidance.guide(x, t, **cond), guidance, channels)
    # Both: the conditional and unconditional passes in one batched call, the guide in its own.
    half = len(x) // 2
    out = model(x, t, **cond)
    conditional, uncond = out[:half], out[half:]
    guide = guidance.guide(x[:half], t[:half], **_rows(cond, half))
    _count(counter, 3)
    mixed = _mix(conditional, uncond, guide, guidance, channels)
    # Both halves get the guided prediction; the second half keeps its own extra channels, as forward_with_cfg.
    return torch.cat([mixed, torch.cat([mixed[:, :channels], uncond[:, channels:]], dim=1)], dim=0)


def _count(counter, evaluations: int) -> None:
    # Network evaluations per sample: what sampling cost is compared by (NFE).
    if counter is not None:
        counter["nfe"] = counter.get("nfe", 0) + evaluations


def guided_model_fn(model, guidance: Guidance, objective=None, counter=None):
    """model_fn(x, t, **cond) for the objective's sampler: guided as `guidance` says, `cond` the model's
    condition keywords (class labels `y`, or a caption's tensors), doubled [conditional; unconditional]
    under classifier-free guidance.

    `counter`, a dict, gets "nfe": network evaluations per sample so far (a conditional pass counts 1, an
    unconditional pass 1, a guide pass 1). Outside `guidance.interval` (needs `objective`) only the
    conditional pass runs; its prediction fills both halves of a doubled batch."""
    if guidance.interval is not None and objective is None:
        raise ConfigError("a guidance interval needs the objective whose noise levels it is in; pass objective=")
    if not guidance.active:
        def plain(x, t, **cond):
            _count(counter, 1)
            return model(x, t, **cond)

        return plain
    lo, hi = guidance.interval if guidance.interval is not None else (None, None)

    def guided(x, t, **cond):
        if lo is None:
            return guided_call(model, guidance, x, t, counter, **cond)
        sigma = objective.noise_level(t)
        inside = ((sigma > lo) & (sigma <= hi)).to(x.device)
        if bool(inside.all()):
            return guided_call(model, guidance, x, t, counter, **cond)
        half = len(x) // 2 if guidance.doubled else len(x)
        conditional = model(x[:half], t[:half], **_rows(cond, half))
        plain = torch.cat([conditional, conditional]) if guidance.doubled else conditional
        if not bool(inside.any()):
            _count(counter, 1)
            return plain
        # Mixed noise levels in one batch (the samplers here never make one): blend per sample.
        full = guided_call(model, guidance, x, t, counter, **cond)
        return torch.where(inside.view(-1, *([1] * (x.dim() - 1))), full, plain)

    return guided
