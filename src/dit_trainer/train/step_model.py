"""The network as an objective calls it in one micro-batch of a train step (`Objective.losses`' model_fn).

It holds what the step decided for these samples, so the objective passes only what it varies: the
condition's keyword arguments (dropout applied), the token routing, REPA's feature request, and the run's
autocast and activation budget. An objective that calls the network more than once (MeanFlow's JVP and
guidance passes) gets the same network each time, with the dropout mask or autocast overridden where it
asks; overriding the mask needs the condition before dropout (`HeldCondition`).
"""

import contextlib
from typing import NamedTuple

import torch

from dit_trainer.repa.objective import as_float


class HeldCondition(NamedTuple):
    """The step's condition before dropout: the Condition, its keyword arguments (each (B, ...)), the (B,) mask."""

    condition: object
    kwargs: dict
    mask: torch.Tensor

    def part(self, index) -> "HeldCondition":
        """The rows `index` (a slice or a 1-D index tensor)."""
        return HeldCondition(self.condition, {k: v[index] for k, v in self.kwargs.items()}, self.mask[index])


class StepModel:
    """model_fn(x_t, t, h=None, drop=None, amp=True, w=None) -> the network's float32 output for this micro-batch.

    `drop` (n,) replaces the step's dropout mask for this call (all ones: unconditional, zeros:
    conditional; needs `held`); `amp=False` runs it in float32 inside the run's autocast; `h` is MeanFlow's
    interval, `w` the guidance scale a model that embeds one is asked for. `dropped` is the step's own mask;
    `rows(index)` the same network for some of the samples."""

    def __init__(self, model, cond, context, extra=None, held=None):
        self.model, self.cond, self.context, self.held = model, dict(cond), context, held
        self.extra = dict(extra or {})

    @property
    def dropped(self) -> torch.Tensor:
        """(n,) the step's dropout mask (nonzero: made unconditional)."""
        if self.held is None:
            raise ValueError("this step's model was built without its condition before dropout (HeldCondition)")
        return self.held.mask

    def rows(self, index) -> "StepModel":
        """The same network for the samples `index` (a 1-D index tensor) of this micro-batch: their
        condition, mask and routing."""
        extra = dict(self.extra)
        if "route" in extra:
            extra["route"] = extra["route"].part(index)
        held = None if self.held is None else self.held.part(index)
        return StepModel(self.model, {k: v[index] for k, v in self.cond.items()}, self.context, extra, held)

    def __call__(self, x_t, t, h=None, drop=None, amp=True, w=None):
        kwargs = dict(self.extra)
        if h is not None:
            kwargs["h"] = h
        if w is not None:
            kwargs["w"] = w
        cond = self.cond
        if drop is not None:
            if self.held is None:
                raise ValueError("overriding the dropout mask needs the condition before dropout (HeldCondition)")
            cond = self.held.condition.drop(self.held.kwargs, drop)
        with self.context(), (contextlib.nullcontext() if amp else torch.autocast(x_t.device.type, enabled=False)):
            out = self.model(x_t, t, **cond, **kwargs)
        return as_float(out)
