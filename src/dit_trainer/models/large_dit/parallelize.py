"""Large-DiT's parallel plan: how tensor parallelism splits a LLaMA block by whole heads, where
pipeline stages cut, and which units activation checkpointing, compile and FSDP wrap. The
machinery is `parallel/`'s; this file only names Large-DiT's modules.

TP (Megatron/torchtitan style, one all-reduce per attention and one per SwiGLU): wq, wk, wv
column-wise, each rank holding whole query heads and whole kv heads (with GQA a rank's query
heads are exactly those that read its kv heads, since head i reads kv head i // (n_heads /
n_kv_heads)); wo row-wise; w1, w3 column-wise, w2 row-wise. The q/k LayerNorms normalise over
all heads of a token, so their weights are split like the heads and their statistics are
reduced across ranks (see `QKNorm`). RMSNorms, adaLN modulation, the embedders and the final
layer stay replicated: adaLN acts on the (B, ≤1024) conditioning vector and is not worth a
collective, although at 7B its 25M parameters per layer are 11% of the block (row-sharding it
with an all-gather of the 6·dim modulation is the next step if memory asks for it).
"""

import torch.nn as nn
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from dit_trainer.parallel.parallelize import parallelize_units
from dit_trainer.parallel.pipeline_parallel import build_pipeline, prune_to_stage
from dit_trainer.parallel.tp import apply_tp_plan, check_tp_divides
from dit_trainer.parallel.utils import module_list

# Only the first pipeline stage embeds, only the last one runs the final layer.
FIRST_STAGE_ONLY = ("x_embedder", "t_embedder", "y_embedder")
LAST_STAGE_ONLY = ("final_layer",)


class HeadShardedNorm(ParallelStyle):
    """A q/k LayerNorm whose input arrives split by heads (a DTensor on the last dim): its weight
    and bias are split the same way, and its output goes on as this rank's local heads."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        for name, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, nn.Parameter(distribute_tensor(param.data, device_mesh, [Shard(0)])))
        module.register_forward_hook(lambda mod, args, out: out.to_local())
        return module


def tp_plan(qk_norm: bool) -> dict:
    """Submodule path -> ParallelStyle for one TransformerBlock."""
    plan = {
        # With q/k norms the projections hand on DTensors so the norms can reduce across shards.
        "attention.wq": ColwiseParallel(use_local_output=not qk_norm),
        "attention.wk": ColwiseParallel(use_local_output=not qk_norm),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    if qk_norm:
        plan["attention.q_norm"] = HeadShardedNorm()
        plan["attention.k_norm"] = HeadShardedNorm()
    return plan


def units(model: nn.Module) -> list:
    """The repeated layers of a full model or of a pipeline stage."""
    return module_list(model.layers)


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Split attention heads (query and kv) and SwiGLU width over `tp_mesh`, whole heads per rank."""
    tp = tp_mesh.size()
    layers = units(model)
    for layer in layers:
        attn = layer.attention
        hidden = layer.feed_forward.w1.out_features
        counts = ((attn.n_heads, "query heads", "model.n_heads"), (attn.n_kv_heads, "kv heads", "model.n_kv_heads"),
                  (hidden, "SwiGLU channels (model.dim x 8/3 x model.ffn_dim_multiplier, rounded up to a multiple "
                   "of model.multiple_of)", "model.multiple_of (a multiple of parallel.tp), model.ffn_dim_multiplier "
                   "or model.dim"))
        check_tp_divides(tp, counts, of=" of Large-DiT")
    apply_tp_plan(layers, tp_mesh, tp_plan(not isinstance(layers[0].attention.q_norm, nn.Identity)) if layers else {})


def parallelize_large_dit(model: nn.Module, dims, cfg, param_dtype=None) -> nn.Module:
    """TP -> AC -> compile -> FSDP/DDP over Large-DiT's layers (a no-op on one process without AC/compile)."""
    return parallelize_units(model, units(model), dims, cfg, tp_fn=apply_tp, param_dtype=param_dtype)


def split_stage(model: nn.Module, start: int, end: int, first: bool, last: bool) -> nn.Module:
    """Prune `model` in place to layers [start, end), keeping the full model's parameter names.

    Every layer carries its own rotary tables (non-persistent buffers), so any stage has them.
    """
    return prune_to_stage(model, "layers", start, end, first, last, FIRST_STAGE_ONLY, LAST_STAGE_ONLY)


def pipeline_large_dit(model: nn.Module, dims, cfg, loss_fn, device=None, parallelize_fn=None):
    """This rank's stages of Large-DiT and the schedule: (schedule, parts, has_first, has_last)."""
    return build_pipeline(model, dims, cfg, len(model.layers), split_stage, loss_fn, device, parallelize_fn)


__all__ = ["HeadShardedNorm", "apply_tp", "parallelize_large_dit", "pipeline_large_dit", "split_stage", "tp_plan",
           "units"]
