"""The network as an objective calls it in one micro-batch of a train step (`Objective.losses`' model_fn).

It holds what the step decided for these samples, so the objective passes only what it varies: the
condition (labels) and its dropout mask, the token routing, REPA's feature request, and the run's
autocast and activation budget. An objective that calls the network more than once (MeanFlow's JVP and
guidance passes) gets the same network each time, with the mask or autocast overridden where it asks.
"""

import contextlib

import torch

from dit_trainer.repa.objective import as_float


class StepModel:
    """model_fn(x_t, t, h=None, drop=None, amp=True) -> the network's float32 output for this micro-batch.

    `drop` (n,) replaces the step's label-dropout mask for this call (all ones: unconditional, zeros:
    conditional); `amp=False` runs it in float32 inside the run's autocast; `h` is MeanFlow's interval.
    `dropped` is the step's own mask; `rows(index)` the same network for some of the samples."""

    def __init__(self, model, y, drop, context, extra=None):
        self.model, self.y, self.dropped, self.context = model, y, drop, context
        self.extra = dict(extra or {})

    def rows(self, index) -> "StepModel":
        """The same network for the samples `index` (a 1-D index tensor) of this micro-batch: their labels,
        mask and routing."""
        extra = dict(self.extra)
        if "route" in extra:
            extra["route"] = extra["route"].part(index)
        return StepModel(self.model, self.y[index], self.dropped[index], self.context, extra)

    def __call__(self, x_t, t, h=None, drop=None, amp=True):
        kwargs = dict(self.extra)
        if h is not None:
            kwargs["h"] = h
        with self.context(), (contextlib.nullcontext() if amp else torch.autocast(x_t.device.type, enabled=False)):
            out = self.model(x_t, t, y=self.y, force_drop_ids=self.dropped if drop is None else drop, **kwargs)
        return as_float(out)
