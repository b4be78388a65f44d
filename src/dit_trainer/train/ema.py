"""The EMA decay schedule; the average itself is `parallel.ema.ShardedEMA`, kept like the parameters."""


def ema_decay_at(step: int, decay: float, warmup: bool) -> float:
    """The decay for this update; with warmup, early steps average over fewer steps."""
    return min(decay, (1 + step) / (10 + step)) if warmup else decay
