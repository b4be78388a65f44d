"""The learning rate at each step: linear warmup, then constant (the releases' recipes), or a decay to
`optim.min_lr` by `train.max_steps`, cosine or linear, over the whole run after warmup or over its last
`optim.decay_steps` (a warmup-stable-decay schedule, whose cooldown can start from any kept checkpoint).

A pure function of the step and the config, so a resumed run follows the schedule exactly, and a run resumed
with a longer `train.max_steps` moves its decay to the new end.
"""

import math


def lr_factor(step: int, optim, max_steps: int) -> float:
    """The multiple of `optim.lr` used by optimizer step `step` (0-based)."""
    warmup = optim.warmup_steps
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if optim.lr_schedule == "constant":
        return 1.0
    start = max(warmup, max_steps - optim.decay_steps) if optim.decay_steps else warmup
    span = max_steps - start
    if span <= 0 or step < start:
        return 1.0
    done = min(1.0, (step - start) / span)
    shape = 0.5 * (1 + math.cos(math.pi * done)) if optim.lr_schedule == "cosine" else 1 - done
    floor = optim.min_lr / optim.lr
    return floor + (1 - floor) * shape
