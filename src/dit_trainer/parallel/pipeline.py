"""Pipeline parallelism for DiT with torch.distributed.pipelining.

Stage i runs a contiguous range of blocks. The first stage also embeds (x_t, t, y) into
(tokens, c); every stage passes (tokens, c) on, so the conditioning vector travels with the
activations; the last stage applies the final layer and computes the diffusion loss. The loss
needs x_start, the noise and t, which only the first stage's inputs carry: they travel as the
schedule's `target`, packed into one contiguous float tensor that the schedule microbatches like
the inputs.
"""

import copy
import types

import torch
import torch.distributed as dist
import torch.nn as nn

from dit_trainer.errors import ConfigError

SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")


def stage_ranges(depth: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous block ranges, as even as possible; earlier stages take the remainder."""
    if num_stages > depth:
        raise ConfigError(f"parallel.pp asks for {num_stages} pipeline stages but the model has only {depth} blocks")
    base, extra = divmod(depth, num_stages)
    ranges, start = [], 0
    for s in range(num_stages):
        end = start + base + (1 if s < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


class _PatchSizeOnly(nn.Module):
    """Stands in for `x_embedder` on later stages: `unpatchify` reads only its patch size."""

    def __init__(self, patch_size):
        super().__init__()
        self.patch_size = patch_size


def _stage_forward_first(self, x, t, y, force_drop_ids=None):
    tokens, c = self.embed(x, t, y, force_drop_ids)
    return self._run_blocks(tokens, c)


def _stage_forward_middle(self, tokens, c):
    return self._run_blocks(tokens, c)


def _stage_forward_last(self, tokens, c):
    tokens, c = self._run_blocks(tokens, c)
    return self.head(tokens, c)


def _stage_forward_only(self, x, t, y, force_drop_ids=None):
    tokens, c = self.embed(x, t, y, force_drop_ids)
    return self.head(*self._run_blocks(tokens, c))


def _run_blocks(self, tokens, c):
    for block in self.blocks.values():
        tokens = block(tokens, c)
    # gloo send/recv needs contiguous buffers.
    return tokens.contiguous(), c.contiguous()


def build_stage_module(model: nn.Module, start: int, end: int, first: bool, last: bool) -> nn.Module:
    """Prune `model` in place to blocks [start, end), keeping the full model's parameter names."""
    blocks = model.blocks
    # A ModuleDict keyed by the original indices keeps FQNs ("blocks.7.attn.qkv.weight"), so a
    # checkpoint saved under one pipeline layout loads under any other.
    model.blocks = nn.ModuleDict({str(i): blocks[i] for i in range(start, end)})
    if not first:
        patch = model.x_embedder.patch_size
        del model.x_embedder, model.t_embedder, model.y_embedder, model.pos_embed
        model.x_embedder = _PatchSizeOnly(patch)
    if not last:
        del model.final_layer
    model._run_blocks = types.MethodType(_run_blocks, model)
    fwd = {
        (True, True): _stage_forward_only,
        (True, False): _stage_forward_first,
        (False, False): _stage_forward_middle,
        (False, True): _stage_forward_last,
    }[(first, last)]
    model.forward = types.MethodType(fwd, model)
    return model


def pipeline_dit(model: nn.Module, dims, cfg, loss_fn, device=None, parallelize_fn=None):
    """Split `model` into this rank's stages and build the schedule.

    `loss_fn(output, target)` runs on the last stage per microbatch (see `pipeline_loss`).
    Returns (schedule, model_parts, has_first_stage, has_last_stage).
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    par = getattr(cfg, "parallel", cfg)
    name = par.pp_schedule.lower()
    if name not in SCHEDULES:
        raise ConfigError(f"parallel.pp_schedule must be one of {', '.join(SCHEDULES)}, got {par.pp_schedule!r}")
    pp, pp_rank = dims.pp, dims.pp_rank
    per_rank = 2 if name == "interleaved1f1b" else 1
    num_stages = pp * per_rank
    ranges = stage_ranges(len(model.blocks), num_stages)
    # Loop-style assignment: rank r holds stages r, r + pp, ...; stage 0 and the last sit on
    # pp ranks 0 and pp - 1.
    stage_ids = [pp_rank + k * pp for k in range(per_rank)]
    device = torch.device(device) if device is not None else torch.device("cpu")
    group = dims.mesh["pp"].get_group()

    parts, stages = [], []
    for k, sid in enumerate(stage_ids):
        source = model if k == per_rank - 1 else copy.deepcopy(model)
        part = build_stage_module(source, *ranges[sid], first=sid == 0, last=sid == num_stages - 1)
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
# The loss on the last stage


def pack_target(x_start: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, w=None) -> torch.Tensor:
    """(x_start, noise, t, w) as one contiguous (B, 2*C*H*W + 2) float32 tensor; t < 2**24 is exact."""
    b = x_start.shape[0]
    w = torch.ones(b, device=x_start.device) if w is None else w
    parts = [x_start.reshape(b, -1).float(), noise.reshape(b, -1).float(), t.reshape(b, 1).float(), w.reshape(b, 1).float()]
    return torch.cat(parts, dim=1).contiguous()


def unpack_target(target: torch.Tensor, sample_shape, dtype=torch.float32):
    """Inverse of `pack_target` for samples of shape (C, H, W): (x_start, noise, t, w)."""
    n = 1
    for s in sample_shape:
        n *= s
    b = target.shape[0]
    x_start = target[:, :n].reshape(b, *sample_shape).to(dtype)
    noise = target[:, n : 2 * n].reshape(b, *sample_shape).to(dtype)
    t = target[:, 2 * n].round().long()
    w = target[:, 2 * n + 1].to(dtype)
    return x_start, noise, t, w


def pipeline_loss(loss_fn, sample_shape):
    """Adapt `loss_fn(model_output, x_start, noise, t) -> per-sample losses` to the schedule's (output, target)."""

    def fn(output, target):
        x_start, noise, t, w = unpack_target(target, sample_shape)
        return (loss_fn(output, x_start, noise, t) * w).mean()

    return fn


def diffusion_loss(diffusion):
    """The diffusion loss from a model output already computed: `training_losses` with a frozen model.

    `training_losses` recomputes x_t = q_sample(x_start, t, noise), which is what the first stage
    embedded, and needs x_start, x_t and t for the learned-sigma VB term.
    """

    def fn(output, x_start, noise, t):
        return diffusion.training_losses(lambda *a, **k: output.float(), x_start, t, noise=noise)["loss"]

    return fn


def pipeline_step(schedule, has_first, has_last, dims, x_t, t, y, drop, target) -> torch.Tensor:
    """One forward-backward through the pipeline; returns the batch's mean loss on every pp rank."""
    losses = []
    if has_first:
        args = (x_t, t, y) if drop is None else (x_t, t, y, drop)
        schedule.step(*args, target=target, losses=losses, return_outputs=False)
    else:
        schedule.step(target=target, losses=losses, return_outputs=False)
    if has_last:
        loss = torch.stack([l.detach().float() for l in losses]).mean()
    else:
        loss = torch.zeros((), dtype=torch.float32, device=target.device)
    # Rank 0, which writes the metrics, holds the first stage: the loss comes back from the last.
    dist.broadcast(loss, group=dims.mesh["pp"].get_group(), group_src=dims.pp - 1)
    return loss
