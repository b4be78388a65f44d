"""Exponential moving average of the weights: what sampling uses."""

import copy

import torch


def create_ema(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of `model` to hold the moving average."""
    ema = copy.deepcopy(model)
    ema.requires_grad_(False)
    ema.eval()
    return ema


def ema_decay_at(step: int, decay: float, warmup: bool) -> float:
    """The decay for this update; with warmup, early steps average over fewer steps."""
    return min(decay, (1 + step) / (10 + step)) if warmup else decay


@torch.no_grad()
def update_ema(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    """ema ← decay·ema + (1−decay)·model for trained parameters, as DiT's `update_ema`; frozen ones are copied."""
    ema_params = [p for _, p in ema.named_parameters()]
    params = [p.detach() for _, p in model.named_parameters()]
    if len(ema_params) != len(params):
        raise RuntimeError("EMA and model have different parameters")
    trained = [i for i, (_, p) in enumerate(model.named_parameters()) if p.requires_grad]
    frozen = [i for i, (_, p) in enumerate(model.named_parameters()) if not p.requires_grad]
    if frozen:
        # Averaging a constant rounds it away from itself in fp32 (pos_embed by ~1e-6); exporters
        # check that table against DiT's exact one, so it is kept equal to the model's.
        torch._foreach_copy_([ema_params[i] for i in frozen], [params[i] for i in frozen])
    if trained:
        # Under FSDP these are DTensors; foreach ops work on their local shards.
        ema_trained = [ema_params[i] for i in trained]
        torch._foreach_mul_(ema_trained, decay)
        torch._foreach_add_(ema_trained, [params[i] for i in trained], alpha=1 - decay)
