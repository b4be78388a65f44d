"""Small helpers shared by the parallel code and the trainer: local shards, data slices, norms."""

import math

import torch
import torch.distributed as dist


def is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (a collective for DTensors)."""
    return t.full_tensor() if is_dtensor(t) else t


def dp_slice(tensor: torch.Tensor, dims) -> torch.Tensor:
    """This data-parallel rank's contiguous slice of a global-batch tensor; TP/PP peers get the same."""
    if tensor is None or not dims.dp_enabled:
        return tensor
    n = dims.local_batch_size(tensor.shape[0])
    return tensor[dims.dp_rank * n : (dims.dp_rank + 1) * n]


def dp_indices(indices, dims):
    """This rank's share of a global batch of sample indices (contiguous, like `dp_slice`)."""
    if not dims.dp_enabled:
        return indices
    n = dims.local_batch_size(len(indices))
    return indices[dims.dp_rank * n : (dims.dp_rank + 1) * n]


def global_label_drop(y: torch.Tensor, label_embedder) -> torch.Tensor:
    """Classifier-free-guidance label dropout drawn over the whole global batch.

    The same call `LabelEmbedder.token_drop` makes, at the same point of the RNG stream, so a
    sharded run drops the labels a 1-process run drops; the caller then disables the model's
    own per-rank draw (`label_embedder.dropout_prob = 0`).
    """
    p = label_embedder.dropout_prob
    if p <= 0:
        return y
    drop = torch.rand(y.shape[0], device=y.device) < p
    return torch.where(drop, label_embedder.num_classes, y)


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, pp_group=None, foreach=True) -> torch.Tensor:
    """Clip the global gradient norm over sharded (DTensor) and plain gradients and pipeline stages.

    Gradients on different meshes cannot be stacked into one norm, so each (mesh, placements)
    group is reduced on its own and the squares are summed; stages add theirs over `pp_group`.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
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
        # Scale local shards by a float: DTensor and plain gradients cannot share one foreach op.
        coef = min(max_norm / (total.item() + 1e-6), 1.0)
        if coef < 1.0:
            torch._foreach_mul_([local(g) for g in grads], coef)
    return total


def verify_grad_average(group, device=None) -> None:
    """Fail fast if this backend's AVG all-reduce sums instead of averaging (pytorch#162338)."""
    n = dist.get_world_size(group)
    x = torch.full((1,), float(dist.get_rank(group) + 1), device=device)
    dist.all_reduce(x, op=dist.ReduceOp.AVG, group=group)
    expected = (n + 1) / 2
    if abs(x.item() - expected) > 1e-6 * expected:
        raise RuntimeError(
            f"{dist.get_backend(group)} AVG all-reduce returned {x.item()} instead of {expected}; "
            "gradients would be summed, not averaged"
        )
