"""Checkpoints, read and written by training and sampling alike: atomic step folders of
safetensors and weights-only `.pt` files (`files`), and DCP shards that reshard N -> M (`sharded`,
imported on use since it needs torch.distributed). `open(path)` (`reader`) reads any of them.
"""

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
from dit_trainer.checkpoint.reader import CheckpointReader, open


__all__ = [
    "CheckpointReader",
    "begin_checkpoint",
    "checkpoint_folder",
    "checkpoint_root",
    "commit_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_into",
    "load_pt",
    "load_weights",
    "open",
    "save_checkpoint",
]
