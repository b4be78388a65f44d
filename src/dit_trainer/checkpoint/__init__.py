"""Checkpoints, read and written by training and sampling alike: atomic step folders of
safetensors and weights-only `.pt` files (`files`), and DCP shards that reshard N -> M (`sharded`,
imported on use since it needs torch.distributed)."""

from dit_trainer.checkpoint.files import (
    begin_checkpoint,
    checkpoint_folder,
    checkpoint_root,
    commit_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_into,
    load_pt,
    load_weights,
    save_checkpoint,
)

__all__ = [
    "begin_checkpoint",
    "checkpoint_folder",
    "checkpoint_root",
    "commit_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_into",
    "load_pt",
    "load_weights",
    "save_checkpoint",
]
