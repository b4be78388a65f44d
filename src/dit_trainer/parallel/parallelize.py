"""Tensor parallel, activation checkpointing, compile and FSDP/DDP for DiT, in torchtitan's order."""

import functools

import torch
import torch.distributed as dist
import torch.nn as nn

from dit_trainer.errors import ConfigError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parallelize_dit(model: nn.Module, dims, cfg, param_dtype=None, reduce_dtype=torch.float32) -> nn.Module:
    """Apply tp -> ac -> compile -> fsdp/ddp to `model` (or to one pipeline stage of it), in place."""
    train = getattr(cfg, "train", None)
    par = getattr(cfg, "parallel", cfg)
    if param_dtype is None:
        param_dtype = _DTYPES.get(getattr(train, "mixed_precision", "fp32"), torch.float32)
    mesh = dims.mesh if dims.distributed else None
    if dims.tp_enabled:
        apply_tp(model, mesh["tp"])
    ac_mode = getattr(train, "activation_checkpointing", "none")
    if ac_mode and ac_mode != "none":
        apply_ac(model, ac_mode)
    if getattr(train, "compile", False):
        apply_compile(model)
    # DDP does not compose with TP's DTensors or with PP's many forwards before one backward:
    # replicas beside TP/PP are FSDP2 with a shard group of one (HSDP), which does.
    replicate_only = dims.dp_replicate > 1 and dims.dp_shard == 1
    if dims.fsdp_enabled or (replicate_only and (dims.tp_enabled or dims.pp_enabled)):
        dp_mesh = mesh["dp_replicate", "dp_shard"] if dims.dp_replicate > 1 else mesh["dp_shard"]
        apply_fsdp(
            model,
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
# Tensor parallel


def qkv_to_tp_layout(t: torch.Tensor, tp: int) -> torch.Tensor:
    """Released rows [q | k | v] -> [q_0 k_0 v_0 | q_1 k_1 v_1 | ...], one group of whole heads per rank."""
    return t.reshape(3, tp, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def qkv_to_released_layout(t: torch.Tensor, tp: int) -> torch.Tensor:
    """Inverse of `qkv_to_tp_layout`: what checkpoints and the released weights hold."""
    return t.reshape(tp, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


# Set on each `attn.qkv` whose rows apply_tp regrouped; checkpoints read it to restore the release.
QKV_TP_ATTR = "_dit_qkv_tp"


def qkv_tp_degrees(model: nn.Module) -> dict:
    """FQN prefix of every regrouped `attn.qkv` -> its tp degree."""
    return {name: getattr(m, QKV_TP_ATTR) for name, m in model.named_modules() if hasattr(m, QKV_TP_ATTR)}


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Split heads and MLP width over `tp_mesh`: qkv/fc1 column-wise, proj/fc2 row-wise.

    Embedders, adaLN modulation and the final layer stay replicated: they act on the (B, D)
    conditioning vector or on cheap per-token maps, so sharding them saves little and adds
    collectives.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = tp_mesh.size()
    for idx, block in _blocks(model):
        heads = block.attn.qkv.out_features // 3 // block.attn.head_dim
        if heads % tp or block.mlp.fc1.out_features % tp:
            raise ConfigError(
                f"parallel.tp={tp} does not divide the {heads} attention heads and "
                f"{block.mlp.fc1.out_features} MLP channels; pick a divisor of {heads}"
            )
        qkv = block.attn.qkv
        # Sharding [q | k | v] row-wise as is would hand rank 0 all of q and part of k; regroup
        # so that each rank's contiguous shard holds whole heads of q, k and v.
        with torch.no_grad():
            qkv.weight.copy_(qkv_to_tp_layout(qkv.weight, tp))
            if qkv.bias is not None:
                qkv.bias.copy_(qkv_to_tp_layout(qkv.bias, tp))
        setattr(qkv, QKV_TP_ATTR, tp)
        parallelize_module(
            block,
            tp_mesh,
            {
                "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(),
                "mlp.fc1": ColwiseParallel(),
                "mlp.fc2": RowwiseParallel(),
            },
        )


def _blocks(model):
    """(index, block) pairs of a full model or of a pipeline stage whose `blocks` is a ModuleDict."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return []
    if isinstance(blocks, nn.ModuleDict):
        return list(blocks.items())
    return list(enumerate(blocks))


# ---------------------------------------------------------------------------------------------
# Activation checkpointing


def _selective_policy():
    """Keep matmul and attention outputs (costly to recompute); recompute norms and pointwise ops."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
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


def apply_ac(model: nn.Module, mode: str) -> None:
    """Recompute each block's activations in backward: all of them ("full") or the cheap ones ("selective")."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if mode not in ("full", "selective"):
        raise ConfigError(f"train.activation_checkpointing must be none, full or selective, got {mode!r}")
    for _, block in _blocks(model):
        forward = block.forward
        kwargs = dict(use_reentrant=False, preserve_rng_state=False)
        if mode == "selective":
            kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _selective_policy())
        # Wrapping forward (not the module) keeps parameter names, so checkpoints and EMA keys
        # are the same with and without AC; FSDP's hooks still run around the recomputation.
        block.forward = _checkpointed(forward, kwargs)


# ---------------------------------------------------------------------------------------------
# Compile


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block in place: blocks repeat, so one graph serves them all."""
    for _, block in _blocks(model):
        block.compile()


# ---------------------------------------------------------------------------------------------
# Data parallel


def apply_fsdp(model, dp_mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, reshard_after_forward=True):
    """fully_shard each block, then the root (embedders, final layer); HSDP when `dp_mesh` is 2-D."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = _blocks(model)
    for i, (_, block) in enumerate(blocks):
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


def apply_ddp(model, dp_mesh):
    """Replicate the model over `dp_mesh`, averaging gradients in buckets (DDP)."""
    from torch.distributed._composable.replicate import replicate

    replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100)
    return model
