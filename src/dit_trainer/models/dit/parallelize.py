"""DiT's parallel plan: which modules tensor parallelism splits, where pipeline stages cut, and
which units activation checkpointing, compile and FSDP wrap. The machinery is `parallel/`'s."""

import torch.nn as nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from dit_trainer.parallel.parallelize import parallelize_units
from dit_trainer.parallel.pipeline_parallel import build_pipeline, prune_to_stage
from dit_trainer.parallel.tp import apply_tp_plan, check_tp_divides, regroup_fused_rows
from dit_trainer.parallel.utils import module_list

# Column-wise in, row-wise out: one all-reduce per attention and per MLP. Embedders, adaLN
# modulation, the block's norms and the final layer stay replicated: they act on the (B, D)
# conditioning vector or on cheap per-token maps, so sharding them would save little and add
# collectives. RoPE has no parameters and rotates each rank's own heads.
TP_PLAN = {
    "attn.qkv": ColwiseParallel(),
    "attn.proj": RowwiseParallel(),
    "mlp.fc1": ColwiseParallel(),
    "mlp.fc2": RowwiseParallel(),
}
# model.mlp swiglu: w1 and w3 split by hidden channel like fc1, w2 by input like fc2.
SWIGLU_PLAN = {"mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(), "mlp.w2": RowwiseParallel()}
# model.qk_norm: the per-head norms see only this rank's heads (dim 2 of (B, N, H, D)), so their weight
# is a replicated DTensor whose gradient is summed over the ranks' heads, as for a sequence-sharded norm.
_HEAD_NORM = SequenceParallel(sequence_dim=2, use_local_output=True)
QK_NORM_PLAN = {"attn.q_norm": _HEAD_NORM, "attn.k_norm": _HEAD_NORM}
# Only the first pipeline stage embeds, only the last one runs the final layer.
FIRST_STAGE_ONLY = ("x_embedder", "t_embedder", "y_embedder", "pos_embed")
LAST_STAGE_ONLY = ("final_layer",)


def units(model: nn.Module) -> list:
    """The repeated blocks of a full model or of a pipeline stage."""
    return module_list(model.blocks)


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Split attention heads and MLP width over `tp_mesh`, each rank holding whole heads."""
    tp = tp_mesh.size()
    blocks = units(model)
    for block in blocks:
        heads = block.attn.qkv.out_features // 3 // block.attn.head_dim
        swiglu = hasattr(block.mlp, "w1")
        width = (block.mlp.w1 if swiglu else block.mlp.fc1).out_features
        what = ("SwiGLU channels (int(2/3 x model.hidden_size x model.mlp_ratio))" if swiglu
                else "MLP channels (model.hidden_size x model.mlp_ratio)")
        check_tp_divides(tp, ((heads, "attention heads", "model.num_heads"),
                              (width, what, "model.mlp_ratio or model.hidden_size")))
        # The fused [q | k | v] rows are regrouped so each rank's shard holds whole q, k and v heads.
        regroup_fused_rows(block.attn.qkv, 3, tp)
    apply_tp_plan(blocks, tp_mesh, tp_plan(blocks[0]) if blocks else TP_PLAN)


def tp_plan(block: nn.Module) -> dict:
    """Submodule path -> ParallelStyle for one DiT block, with its block options' layers."""
    plan = {k: v for k, v in TP_PLAN.items() if not k.startswith("mlp.")}
    plan.update(SWIGLU_PLAN if hasattr(block.mlp, "w1") else {k: TP_PLAN[k] for k in ("mlp.fc1", "mlp.fc2")})
    if block.attn.qk_norm:
        plan.update(QK_NORM_PLAN)
    return plan


def parallelize_dit(model: nn.Module, dims, cfg, param_dtype=None) -> nn.Module:
    """TP -> AC -> compile -> FSDP/DDP over DiT's blocks (a no-op on one process without AC/compile)."""
    return parallelize_units(model, units(model), dims, cfg, tp_fn=apply_tp, param_dtype=param_dtype)


def split_stage(model: nn.Module, start: int, end: int, first: bool, last: bool) -> nn.Module:
    """Prune `model` in place to blocks [start, end), keeping the full model's parameter names."""
    return prune_to_stage(model, "blocks", start, end, first, last, FIRST_STAGE_ONLY, LAST_STAGE_ONLY)


def pipeline_dit(model: nn.Module, dims, cfg, loss_fn, device=None, parallelize_fn=None):
    """This rank's stages of DiT and the schedule: (schedule, parts, has_first, has_last)."""
    return build_pipeline(model, dims, cfg, len(model.blocks), split_stage, loss_fn, device, parallelize_fn)
