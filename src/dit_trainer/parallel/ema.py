"""EMA of the parameters (what sampling uses), each kept exactly like its parameter: a DTensor
shard under FSDP/TP, only this stage's blocks under PP, a plain tensor for a plain module.
Updating touches local shards only, so EMA costs no communication and 1/N of the memory of a
full copy."""

import torch
import torch.nn as nn

from dit_trainer.parallel.utils import is_dtensor, local


def ema_decay_at(step: int, decay: float, warmup: bool) -> float:
    """The decay for this update; with warmup, early steps average over fewer steps."""
    return min(decay, (1 + step) / (10 + step)) if warmup else decay


class ShardedEMA:
    """ema = decay * ema + (1 - decay) * param, per FQN, over one or more model parts."""

    def __init__(self, model_parts):
        if isinstance(model_parts, nn.Module):
            model_parts = [model_parts]
        self.model_parts = list(model_parts)
        # Frozen parameters (pos_embed) are kept too, so the exported EMA loads with strict=True;
        # `update` copies them, since averaging a constant rounds it away from itself in fp32 and
        # exporters check pos_embed against DiT's exact table.
        self.shadow = {
            name: p.detach().clone() for part in self.model_parts for name, p in part.named_parameters()
        }

    def _pairs(self):
        # Built once: the parameters (and their DTensor shards) keep their identity for the run.
        # ((EMA, param) shards of trained parameters), ((EMA, param) shards of frozen ones).
        if getattr(self, "_cached", None) is None:
            named = {n: p for part in self.model_parts for n, p in part.named_parameters()}

            def shards(names):
                return [local(self.shadow[n]) for n in names], [local(named[n].detach()) for n in names]

            self._cached = (shards([n for n, p in named.items() if p.requires_grad]),
                            shards([n for n, p in named.items() if not p.requires_grad]))
        return self._cached

    @torch.no_grad()
    def update(self, decay: float, skip=None) -> None:
        """One EMA step of the trained parameters (decay=0 copies them; `skip`, a 0-d tensor, leaves
        them as they are where 1); frozen ones are copied."""
        (ema, params), (frozen_ema, frozen) = self._pairs()
        if frozen:
            torch._foreach_copy_(frozen_ema, frozen)
        if not ema:
            return
        if skip is not None:
            # Decided on the device (a step masked there, flags read late): ema + w (param - ema), w = 0 when skipped.
            weight = (1.0 - decay) * (1.0 - skip.float())
            torch.ops.aten._foreach_lerp_.List(ema, params, [weight] * len(ema))
            return
        if decay == 0.0:
            torch._foreach_copy_(ema, params)
            return
        # mul then add with alpha: the arithmetic of DiT's update_ema, so that a 1-process run
        # and a sharded run hold the same EMA bit for bit (up to the reductions).
        torch._foreach_mul_(ema, decay)
        torch._foreach_add_(ema, params, alpha=1 - decay)

    def named_parameters(self):
        """(FQN, tensor) pairs in the model parts' order, like a module's."""
        return iter(self.shadow.items())

    def state_dict(self) -> dict:
        """FQN -> tensor (DTensor shards included), for torch.distributed.checkpoint."""
        return dict(self.shadow)

    @torch.no_grad()
    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy values in place, so DTensor placements stay those of the parameters.

        Full tensors are sliced to this rank's shard; sharded ones must match the placements.
        """
        if strict and set(state) != set(self.shadow):
            missing, unexpected = set(self.shadow) - set(state), set(state) - set(self.shadow)
            raise KeyError(f"EMA state mismatch: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
        for name, value in state.items():
            mine = self.shadow.get(name)
            if mine is None or value is mine:
                continue
            if is_dtensor(mine) and not is_dtensor(value):
                from torch.distributed.tensor import distribute_tensor

                value = distribute_tensor(value.to(mine.device), mine.device_mesh, mine.placements, src_data_rank=None)
            local(mine).copy_(local(value))
