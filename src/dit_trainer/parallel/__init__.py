"""Generic distributed machinery: device mesh, FSDP/HSDP/DDP, applying a tensor-parallel plan,
pipeline schedules, activation checkpointing, compile and the sharded EMA. A model family's
`parallelize.py` calls these with its own units and plan; nothing here names a model's modules."""

from dit_trainer.parallel.dims import MESH_DIMS, ParallelDims, choose_backend, init_distributed
from dit_trainer.parallel.ema import ShardedEMA
from dit_trainer.parallel.parallelize import apply_ac, apply_compile, apply_ddp, apply_fsdp, parallelize_units
from dit_trainer.parallel.pipeline_parallel import TargetPacking, build_pipeline, pipeline_step, prune_to_stage, stage_ranges
from dit_trainer.parallel.tp import (
    apply_tp_plan,
    fused_row_layouts,
    fused_rows_to_full_layout,
    fused_rows_to_tp_layout,
    regroup_fused_rows,
)

__all__ = [
    "MESH_DIMS",
    "ParallelDims",
    "choose_backend",
    "init_distributed",
    "ShardedEMA",
    "apply_ac",
    "apply_compile",
    "apply_ddp",
    "apply_fsdp",
    "parallelize_units",
    "TargetPacking",
    "build_pipeline",
    "pipeline_step",
    "prune_to_stage",
    "stage_ranges",
    "apply_tp_plan",
    "fused_row_layouts",
    "fused_rows_to_full_layout",
    "fused_rows_to_tp_layout",
    "regroup_fused_rows",
]
