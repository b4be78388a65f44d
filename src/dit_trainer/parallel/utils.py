"""Small helpers shared by the parallel code and the trainer: local shards, gradient norms, and
the few collectives every rank must call alike (a barrier, agreeing on a flag, rank 0's value)."""

import math

import torch
import torch.distributed as dist


def is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def module_list(container) -> list:
    """The repeated units a model holds in a ModuleList, or a pipeline stage in a ModuleDict by index."""
    return list(container.values()) if isinstance(container, torch.nn.ModuleDict) else list(container)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (a collective for DTensors)."""
    return t.full_tensor() if is_dtensor(t) else t


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, pp_group=None, foreach=True) -> torch.Tensor:
    """Clip the global gradient norm over sharded (DTensor) and plain gradients and pipeline stages.

    Gradients on different meshes cannot be stacked into one norm, so each (mesh, placements)
    group is reduced on its own and the squares are summed; stages add theirs over `pp_group`.
    """
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    if pp_group is None and not any(is_dtensor(g) for g in grads):
        # Plain gradients on one pipeline stage: torch's own clip, bit for bit what a plain loop does.
        if not math.isfinite(max_norm):
            # No clipping, only the norm (the non-finite check): torch's clip would still multiply
            # every gradient by 1, one more pass over all of them each step.
            return torch.nn.utils.get_total_norm(grads, 2.0, foreach=foreach)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, foreach=foreach)
    groups: dict = {}
    for g in grads:
        key = (g.device_mesh, g.placements) if is_dtensor(g) else None
        groups.setdefault(key, []).append(g)
    total_sq = None
    for key, gs in groups.items():
        norm = torch.nn.utils.get_total_norm(gs, 2.0, foreach=foreach)
        norm = full(norm).float()
        total_sq = norm**2 if total_sq is None else total_sq + norm**2
    if total_sq is None:
        total_sq = torch.zeros(())
    if pp_group is not None:
        dist.all_reduce(total_sq, group=pp_group)
    total = total_sq.sqrt()
    if max_norm > 0 and math.isfinite(max_norm):
        # Scale local shards (DTensor and plain gradients cannot share one foreach op) by a device
        # tensor, as torch's own clip does: no host wait for the norm.
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        shards = [local(g) for g in grads]
        if shards:
            torch._foreach_mul_(shards, coef.to(shards[0].device))
    return total



def barrier() -> None:
    """Wait for every rank (nothing on one process)."""
    if dist.is_initialized():
        dist.barrier()


def any_rank(flag: bool, device) -> bool:
    """Whether `flag` is true on any rank (a collective under torchrun; `flag` itself on one process)."""
    if not dist.is_initialized():
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def from_main(value):
    """Rank 0's `value` on every rank (a collective under torchrun; `value` itself on one process)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
