"""Pipeline parallelism with torch.distributed.pipelining, for any model that can be split.

A splittable model exposes `embed(x, t, y, force_drop_ids) -> (tokens, c)`, a container of
repeated units (each `unit(tokens, c)`) and `head(tokens, c)`. Stage i runs a contiguous range of
units; the first stage also embeds, every stage passes (tokens, c) on, so the conditioning vector
travels with the activations, and the last stage applies the head and the objective's loss. The
loss needs the clean input and the step's random draws, which only the first stage's inputs
carry: they travel as the schedule's `target`, packed into one contiguous float tensor that the
schedule microbatches like the inputs. The model family says where to cut (`prune_to_stage`).
"""

import copy
import types

import torch
import torch.distributed as dist
import torch.nn as nn

from dit_trainer.errors import ConfigError

SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")


def stage_ranges(depth: int, num_stages: int, per_rank: int = 1) -> list[tuple[int, int]]:
    """Contiguous unit ranges, as even as possible; earlier stages take the remainder.
    `per_rank`: stages each pp rank holds (2 for interleaved1f1b), named in the error."""
    if num_stages > depth:
        if per_rank > 1:
            # parallel.pp alone is not what exceeds the depth; the schedule doubles it.
            raise ConfigError(
                f"parallel.pp {num_stages // per_rank} x {per_rank} stages per rank of the interleaved1f1b schedule "
                f"asks for {num_stages} pipeline stages but the model has only {depth} blocks; lower parallel.pp, "
                f"or set parallel.pp_schedule 1f1b")
        raise ConfigError(f"parallel.pp asks for {num_stages} pipeline stages but the model has only {depth} blocks; "
                          f"set parallel.pp to at most {depth}")
    base, extra = divmod(depth, num_stages)
    ranges, start = [], 0
    for s in range(num_stages):
        end = start + base + (1 if s < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def _run_units(self, tokens, c):
    for unit in getattr(self, self._pp_units).values():
        tokens = unit(tokens, c)
    # gloo send/recv needs contiguous buffers.
    return tokens.contiguous(), c.contiguous()


def _stage_forward_first(self, x, t, y, force_drop_ids=None):
    return self._run_units(*self.embed(x, t, y, force_drop_ids))


def _stage_forward_middle(self, tokens, c):
    return self._run_units(tokens, c)


def _stage_forward_last(self, tokens, c):
    return self.head(*self._run_units(tokens, c))


def _stage_forward_only(self, x, t, y, force_drop_ids=None):
    return self.head(*self._run_units(*self.embed(x, t, y, force_drop_ids)))


def prune_to_stage(model: nn.Module, units_attr: str, start: int, end: int, first: bool, last: bool,
                   first_only=(), last_only=()) -> nn.Module:
    """Keep units [start, end) of `model.<units_attr>` and the submodules this stage needs, in place.

    `first_only` names what only the first stage runs (embedders), `last_only` what only the last
    runs (the head). Units are kept in a ModuleDict keyed by their original index, so parameter
    names stay those of the full model and a checkpoint saved under one layout loads under any other.
    """
    units = getattr(model, units_attr)
    setattr(model, units_attr, nn.ModuleDict({str(i): units[i] for i in range(start, end)}))
    for name in () if first else first_only:
        delattr(model, name)
    for name in () if last else last_only:
        delattr(model, name)
    model._pp_units = units_attr
    model._run_units = types.MethodType(_run_units, model)
    fwd = {
        (True, True): _stage_forward_only,
        (True, False): _stage_forward_first,
        (False, False): _stage_forward_middle,
        (False, True): _stage_forward_last,
    }[(first, last)]
    model.forward = types.MethodType(fwd, model)
    return model


def build_pipeline(model: nn.Module, dims, cfg, depth: int, split_fn, loss_fn, device=None, parallelize_fn=None):
    """Split `model` into this rank's stages and build the schedule.

    `split_fn(model, start, end, first, last) -> stage module` is the family's cut;
    `loss_fn(output, target)` runs on the last stage per microbatch. Returns
    (schedule, model_parts, has_first_stage, has_last_stage).
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    par = getattr(cfg, "parallel", cfg)
    name = par.pp_schedule.lower()
    if name not in SCHEDULES:
        raise ConfigError(f"parallel.pp_schedule must be one of {', '.join(SCHEDULES)}, got {par.pp_schedule!r}")
    pp, pp_rank = dims.pp, dims.pp_rank
    per_rank = 2 if name == "interleaved1f1b" else 1
    num_stages = pp * per_rank
    ranges = stage_ranges(depth, num_stages, per_rank)
    # Loop-style assignment: rank r holds stages r, r + pp, ...; stage 0 and the last sit on
    # pp ranks 0 and pp - 1.
    stage_ids = [pp_rank + k * pp for k in range(per_rank)]
    device = torch.device(device) if device is not None else torch.device("cpu")
    group = dims.mesh["pp"].get_group()

    parts, stages = [], []
    for k, sid in enumerate(stage_ids):
        source = model if k == per_rank - 1 else copy.deepcopy(model)
        part = split_fn(source, *ranges[sid], first=sid == 0, last=sid == num_stages - 1)
        if parallelize_fn is not None:
            parallelize_fn(part, dims, cfg)
        parts.append(part)
        stages.append(PipelineStage(part, sid, num_stages, device, group=group))

    n_mb = par.pp_microbatches
    if name == "gpipe":
        schedule = ScheduleGPipe(stages[0], n_microbatches=n_mb, loss_fn=loss_fn)
    elif name == "1f1b":
        schedule = Schedule1F1B(stages[0], n_microbatches=n_mb, loss_fn=loss_fn)
    else:
        if n_mb % pp:
            raise ConfigError(f"parallel.pp_microbatches {n_mb} must be a multiple of parallel.pp {pp} for interleaved1f1b")
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=n_mb, loss_fn=loss_fn)
    has_first = 0 in stage_ids
    has_last = num_stages - 1 in stage_ids
    return schedule, parts, has_first, has_last


# ---------------------------------------------------------------------------------------------
# The loss target: the clean input and the step's draws, through the schedule to the last stage


class TargetPacking:
    """Packs named per-sample tensors (leading batch dim) into one contiguous (B, K) float32 tensor.

    Integer tensors below 2**24 (timesteps) survive the float32 round trip exactly.
    """

    def __init__(self, tensors: dict):
        self.layout = [(name, tuple(v.shape[1:]), v.dtype) for name, v in tensors.items()]

    def pack(self, tensors: dict) -> torch.Tensor:
        """One (B, K) float32 tensor holding every entry, flattened, in layout order."""
        b = next(iter(tensors.values())).shape[0]
        return torch.cat([tensors[name].reshape(b, -1).float() for name, _, _ in self.layout], dim=1).contiguous()

    def unpack(self, target: torch.Tensor) -> dict:
        """The tensors `pack` was given, in their shapes and dtypes (for a microbatch of any size)."""
        out, col, b = {}, 0, target.shape[0]
        for name, shape, dtype in self.layout:
            n = 1
            for s in shape:
                n *= s
            piece = target[:, col:col + n].reshape(b, *shape)
            out[name] = piece.round().to(dtype) if not dtype.is_floating_point else piece.to(dtype)
            col += n
        return out


def pipeline_step(schedule, has_first, has_last, dims, inputs, target) -> torch.Tensor:
    """One forward-backward through the pipeline; returns the batch's mean loss on every pp rank."""
    losses = []
    if has_first:
        schedule.step(*inputs, target=target, losses=losses, return_outputs=False)
    else:
        schedule.step(target=target, losses=losses, return_outputs=False)
    if has_last:
        loss = torch.stack([l.detach().float() for l in losses]).mean()
    else:
        loss = torch.zeros((), dtype=torch.float32, device=target.device)
    # Rank 0, which writes the metrics, holds the first stage: the loss comes back from the last.
    dist.broadcast(loss, group=dims.mesh["pp"].get_group(), group_src=dims.pp - 1)
    return loss
