"""`checkpoint.open(path)`: a run folder, a checkpoint folder or a weights file, resolved once.

Sampling, `sample-ddp` and the `ours`/`dit-pt` converters read checkpoints through the reader it
returns, so none of them looks inside folders itself: which step a run folder means, where the
config is, and whether the training weights are a `model.safetensors` or only `dcp/` shards.
"""

import hashlib
from pathlib import Path

from dit_trainer.checkpoint.files import load_weights, resolve_checkpoint

WEIGHTS = ("ema", "model")


class CheckpointReader:
    """What `open` found: a checkpoint folder (`folder`) or a weights file (`file`), and what they hold."""

    def __init__(self, folder=None, file=None):
        self.folder = Path(folder).resolve() if folder is not None else None
        self.file = Path(file).resolve() if file is not None else None

    @property
    def path(self) -> Path:
        """The checkpoint folder or weights file, absolute."""
        return self.folder or self.file

    @property
    def config_file(self):
        """The folder's config.yaml (which may be missing), or None for a weights file."""
        return self.folder / "config.yaml" if self.folder is not None else None

    def config(self):
        """The run's Config from config.yaml, or None for a weights file (which records none)."""
        if self.folder is None:
            return None
        from dit_trainer.config import load_config

        return load_config(str(self.config_file))

    @property
    def sharded(self) -> bool:
        """Whether the training weights are only in `dcp/` shards (a sharded run's checkpoint)."""
        return (self.folder is not None and (self.folder / "dcp").is_dir()
                and not (self.folder / "model.safetensors").is_file())

    def manifest_digest(self):
        """The first 16 hex digits of manifest.json's sha256 (it lists every file's), or None without one."""
        manifest = self.folder / "manifest.json" if self.folder is not None else None
        return hashlib.sha256(manifest.read_bytes()).hexdigest()[:16] if manifest and manifest.is_file() else None

    def weights(self, which: str = "ema") -> dict:
        """A full state dict: "ema" (what sampling uses) or "model" (the training weights, from dcp/ shards
        when the checkpoint has no model.safetensors)."""
        if which not in WEIGHTS:
            raise ValueError(f"weights {which!r} is not one of {', '.join(WEIGHTS)}")
        if which == "model" and self.sharded:
            from dit_trainer.checkpoint.sharded import read_sharded_model

            return read_sharded_model(self.folder)
        return load_weights(self.path, prefer_ema=which == "ema")

    def __repr__(self):
        return f"CheckpointReader({str(self.path)!r})"


def open(path, flag=None) -> CheckpointReader:  # shadows the builtin here only: callers write checkpoint.open
    """A reader of `path`: a run folder (its newest checkpoint), a checkpoint folder or a weights file.

    A reader passed in comes back as it is; `flag` names where the path came from in errors.
    """
    if isinstance(path, CheckpointReader):
        return path
    found = resolve_checkpoint(path, flag)
    return CheckpointReader(folder=found) if found.is_dir() else CheckpointReader(file=found)
