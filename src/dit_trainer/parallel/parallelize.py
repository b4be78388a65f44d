"""Generic parallelization in torchtitan's order: tensor parallel -> activation checkpointing ->
compile -> FSDP/HSDP/DDP. A model family calls `parallelize_units` with its repeated units (the
transformer blocks) and its tensor-parallel plan; nothing here knows a model's modules."""

import functools

import torch
import torch.distributed as dist
import torch.nn as nn

from dit_trainer.errors import ConfigError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parallelize_units(model: nn.Module, units, dims, cfg, tp_fn=None, param_dtype=None,
                      reduce_dtype=torch.float32) -> nn.Module:
    """Apply tp -> ac -> compile -> fsdp/ddp to `model` (or one pipeline stage of it), in place.

    `units` are the repeated blocks (AC, compile and FSDP wrap each); `tp_fn(model, tp_mesh)`
    applies the family's tensor-parallel plan. With every degree 1 only AC and compile apply.
    """
    train = getattr(cfg, "train", None)
    par = getattr(cfg, "parallel", cfg)
    if param_dtype is None:
        param_dtype = _DTYPES.get(getattr(train, "mixed_precision", "fp32"), torch.float32)
    units = list(units)
    mesh = dims.mesh if dims.distributed else None
    if dims.tp_enabled:
        if tp_fn is None:
            raise ConfigError("parallel.tp > 1 but this model family has no tensor-parallel plan; set parallel.tp 1")
        tp_fn(model, mesh["tp"])
    ac_mode = getattr(train, "activation_checkpointing", "none")
    if ac_mode and ac_mode != "none":
        apply_ac(units, ac_mode)
    if str(getattr(train, "compile", False)).lower() == "true":
        apply_compile(units)
    # DDP does not compose with TP's DTensors or with PP's many forwards before one backward:
    # replicas beside TP/PP are FSDP2 with a shard group of one (HSDP), which does.
    replicate_only = dims.dp_replicate > 1 and dims.dp_shard == 1
    if dims.fsdp_enabled or (replicate_only and (dims.tp_enabled or dims.pp_enabled)):
        dp_mesh = mesh["dp_replicate", "dp_shard"] if dims.dp_replicate > 1 else mesh["dp_shard"]
        apply_fsdp(
            model,
            units,
            dp_mesh,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            # Under PP every microbatch would all-gather the stage again.
            reshard_after_forward=getattr(par, "reshard_after_forward", True) and not dims.pp_enabled,
        )
    elif dims.ddp_enabled:
        apply_ddp(model, mesh["dp_replicate"])
    return model


# ---------------------------------------------------------------------------------------------
# Activation checkpointing


def _selective_policy():
    """Keep linear-layer and fused-attention outputs; recompute norms, pointwise ops and bmm.

    The batched matmuls are the CPU attention kernel's scores and weighted values
    (models/attention.py): the scores are heads x tokens^2 per sample, at 256 tokens about half of
    what all the block's linear outputs take, and recomputing them costs two small matmuls; a
    fused SDPA kernel keeps only its output and log-sum-exp, so it stays saved.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    save = {getattr(aten, n).default for n in names if hasattr(aten, n)}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _checkpointed(forward, kwargs):
    from torch.utils.checkpoint import checkpoint

    # A plain function calling `checkpoint` (not a functools.partial of it): dynamo recognises
    # the direct call and compiles the block with its recomputation instead of skipping it.
    def ac_forward(*args):
        return checkpoint(forward, *args, **kwargs)

    return ac_forward


def apply_ac(units, mode: str) -> None:
    """Recompute each unit's activations in backward: all of them ("full") or the cheap ones ("selective")."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if mode not in ("full", "selective"):
        raise ConfigError(f"train.activation_checkpointing must be none, full or selective, got {mode!r}")
    for block in units:
        forward = block.forward
        kwargs = dict(use_reentrant=False, preserve_rng_state=False)
        if mode == "selective":
            kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _selective_policy())
        # Wrapping forward (not the module) keeps parameter names, so checkpoints and EMA keys
        # are the same with and without AC; FSDP's hooks still run around the recomputation.
        block.forward = _checkpointed(forward, kwargs)


# ---------------------------------------------------------------------------------------------
# Compile


def apply_compile(units) -> None:
    """torch.compile each unit in place: units repeat, so one graph serves them all.

    Sizes are compiled as symbols from the first call (parameters stay static): a last partial
    batch, a doubled classifier-free-guidance batch or another sampling grid reuses the graph
    instead of recompiling, or, past dynamo's cache limit, silently falling back to eager.
    """
    for block in units:
        block.compile(dynamic=True)


# ---------------------------------------------------------------------------------------------
# Data parallel


def apply_fsdp(model, units, dp_mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, reshard_after_forward=True):
    """fully_shard each unit, then the root (what is left: embedders, head); HSDP when `dp_mesh` is 2-D."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = list(units)
    for i, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward.
        last = i == len(blocks) - 1
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and not last)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)
    if dist.get_backend(dp_mesh.get_group(0)) == "gloo":
        # gloo's AVG has summed instead of averaged (pytorch#162338): sum, then divide ourselves.
        for module in model.modules():
            if hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)
    return model


def shard_frozen(module, units, mesh):
    """fully_shard a frozen, inference-only `module` over `mesh`: each unit, then the root, every one
    resharded after its forward, so a rank holds 1/N of the weights between calls and one unit whole
    during them. Its forward becomes a collective over `mesh` (every rank calls it, as often)."""
    from torch.distributed.fsdp import fully_shard

    module.requires_grad_(False)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    # Set explicitly: FSDP keeps an unset root gathered after forward, for a backward that never comes.
    fully_shard(module, mesh=mesh, reshard_after_forward=True)
    return module


def apply_ddp(model, dp_mesh):
    """Replicate the model over `dp_mesh`, averaging gradients in buckets (DDP)."""
    from torch.distributed._composable.replicate import replicate

    replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100)
    return model
