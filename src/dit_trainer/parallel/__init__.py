"""Distributed training for DiT: device mesh, FSDP/HSDP/DDP, tensor and pipeline parallel,
activation checkpointing, compile, sharded EMA and DCP checkpoints. Beside the models, never
inside them: the model spec points `parallelize_fn` and `pipelining_fn` here."""

from dit_trainer.parallel.dims import MESH_DIMS, ParallelDims, choose_backend, init_distributed
from dit_trainer.parallel.parallelize import (
    apply_ac,
    apply_compile,
    apply_ddp,
    apply_fsdp,
    apply_tp,
    parallelize_dit,
    qkv_to_released_layout,
    qkv_to_tp_layout,
)

__all__ = [
    "MESH_DIMS",
    "ParallelDims",
    "choose_backend",
    "init_distributed",
    "apply_ac",
    "apply_compile",
    "apply_ddp",
    "apply_fsdp",
    "apply_tp",
    "parallelize_dit",
    "qkv_to_released_layout",
    "qkv_to_tp_layout",
]
