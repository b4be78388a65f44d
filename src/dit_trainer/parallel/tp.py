"""Tensor parallelism: apply a family's plan to its units, and keep fused projections shardable.

A fused projection whose output rows are laid out `[a | b | c]` (attention's q, k and v in one
Linear, say) cannot be column-sharded as is: rank 0 would get all of `a` and part of `b`. Its rows
are regrouped to `[a_0 b_0 c_0 | a_1 b_1 c_1 | ...]` so each rank's contiguous shard holds whole
pieces of each. The module remembers this, and checkpoints convert back to the released layout.
"""

import math

import torch
import torch.nn as nn

from dit_trainer.errors import ConfigError

# Set on each Linear whose rows were regrouped: (number of fused pieces, tp degree).
FUSED_ROWS_ATTR = "_tp_fused_rows"


def fused_rows_to_tp_layout(t: torch.Tensor, groups: int, tp: int) -> torch.Tensor:
    """Rows [a | b | c] -> [a_0 b_0 c_0 | a_1 b_1 c_1 | ...]: one shard of every piece per rank."""
    return t.reshape(groups, tp, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def fused_rows_to_full_layout(t: torch.Tensor, groups: int, tp: int) -> torch.Tensor:
    """Inverse of `fused_rows_to_tp_layout`: what checkpoints and released weights hold."""
    return t.reshape(tp, groups, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


@torch.no_grad()
def regroup_fused_rows(linear: nn.Linear, groups: int, tp: int) -> None:
    """Regroup a fused Linear's rows (weight and bias) for column sharding over `tp` ranks."""
    linear.weight.copy_(fused_rows_to_tp_layout(linear.weight, groups, tp))
    if linear.bias is not None:
        linear.bias.copy_(fused_rows_to_tp_layout(linear.bias, groups, tp))
    setattr(linear, FUSED_ROWS_ATTR, (groups, tp))


def fused_row_layouts(model: nn.Module) -> dict:
    """Parameter FQN -> (groups, tp) for every regrouped weight and bias of `model`."""
    out = {}
    for name, module in model.named_modules():
        layout = getattr(module, FUSED_ROWS_ATTR, None)
        if layout is not None:
            for leaf in ("weight", "bias"):
                out[f"{name}.{leaf}"] = layout
    return out


def apply_tp_plan(units, tp_mesh, plan: dict) -> None:
    """`parallelize_module` each unit with `plan` (submodule path -> ParallelStyle)."""
    from torch.distributed.tensor.parallel import parallelize_module

    for unit in units:
        parallelize_module(unit, tp_mesh, plan)


def check_tp_divides(tp: int, counts, of: str = "") -> None:
    """A one-line ConfigError naming only the (count, what, config keys) triples `tp` does not divide
    (the MLP width usually divides when the heads do not), the keys to change, and the largest degree
    that divides them all; where that is 1, the sizes themselves must change for any tensor parallelism."""
    bad = [(n, what, keys) for n, what, keys in counts if n % tp]
    if not bad:
        return
    parts = " and the ".join(f"{n} {what}" for n, what, _ in bad)
    keys = ", and ".join(keys for _, _, keys in bad)
    largest = math.gcd(*(n for n, _, _ in counts))
    if largest > 1:
        raise ConfigError(f"parallel.tp={tp} does not divide the {parts}{of}; change {keys} so that it does, "
                          f"or pick a parallel.tp that divides {largest}")
    shape = "width or head count" if any("heads" in what for _, what, _ in bad) else "width"
    raise ConfigError(f"parallel.tp={tp} does not divide the {parts}{of}, and no degree above 1 divides all the model's "
                      f"head counts and widths: tensor parallelism needs a different {shape}; change {keys} so "
                      f"that {tp} divides it, or set parallel.tp 1")
