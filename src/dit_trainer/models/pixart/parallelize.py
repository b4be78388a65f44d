"""PixArt's parallel plan: which modules tensor parallelism splits and which units activation
checkpointing, compile and FSDP wrap. The machinery is `parallel/`'s. Not pipelined: every block
reads the caption, which a stage split would have to carry beside the image tokens."""

import torch.nn as nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from dit_trainer.models.dit.parallelize import units
from dit_trainer.parallel.parallelize import parallelize_units
from dit_trainer.parallel.tp import apply_tp_plan, check_tp_divides, regroup_fused_rows

# Column-wise in, row-wise out, per attention and per MLP: one all-reduce each. Cross-attention
# splits its heads like self-attention (q by rows, the fused [k | v] by rows regrouped per rank).
# The caption projection, t_block, the tables and the head act on the (B, D) timestep embedding or
# once per caption token and stay replicated.
TP_PLAN = {
    "attn.qkv": ColwiseParallel(),
    "attn.proj": RowwiseParallel(),
    "cross_attn.q_linear": ColwiseParallel(),
    "cross_attn.kv_linear": ColwiseParallel(),
    "cross_attn.proj": RowwiseParallel(),
    "mlp.fc1": ColwiseParallel(),
    "mlp.fc2": RowwiseParallel(),
}


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Split self- and cross-attention heads and the MLP width over `tp_mesh`, each rank holding whole heads."""
    tp = tp_mesh.size()
    blocks = units(model)
    for block in blocks:
        heads = block.attn.qkv.out_features // 3 // block.attn.head_dim
        check_tp_divides(tp, ((heads, "attention heads", "model.num_heads"),
                              (block.mlp.fc1.out_features, "MLP channels (model.hidden_size x model.mlp_ratio)",
                               "model.mlp_ratio or model.hidden_size")))
        regroup_fused_rows(block.attn.qkv, 3, tp)
        regroup_fused_rows(block.cross_attn.kv_linear, 2, tp)
    apply_tp_plan(blocks, tp_mesh, TP_PLAN)


def parallelize_pixart(model: nn.Module, dims, cfg, param_dtype=None) -> nn.Module:
    """TP -> AC -> compile -> FSDP/DDP over PixArt's blocks (a no-op on one process without AC/compile)."""
    return parallelize_units(model, units(model), dims, cfg, tp_fn=apply_tp, param_dtype=param_dtype)
