"""`checkpoint.open(path)`: a run folder, a checkpoint folder or a weights file, resolved once.

Sampling, `sample-ddp` and the `ours`/`dit-pt` converters read checkpoints through the reader it
returns, so none of them looks inside folders itself: which step a run folder means, where the
config is, and whether the training weights are a `model.safetensors` or only `dcp/` shards.
"""

import hashlib
import sys
from pathlib import Path

from dit_trainer.checkpoint.files import checkpoint_folder, load_weights, resolve_checkpoint
from dit_trainer.errors import DitError

WEIGHTS = ("ema", "model")


class CheckpointReader:
    """What `open` found: a checkpoint folder (`folder`) or a weights file (`file`), and what they hold."""

    def __init__(self, folder=None, file=None, run=None):
        """`run`: the run folder `folder` was resolved from (its newest checkpoint then), so a read that
        rotation pulls away is retried on the run's newest checkpoint."""
        self.folder = Path(folder).resolve() if folder is not None else None
        self.file = Path(file).resolve() if file is not None else None
        self.run = Path(run).resolve() if run is not None else None

    def _read(self, read):
        """`read()`, retried on the run's newest checkpoint while a training run's rotation removes the one
        being read (it removes a checkpoint only after committing a newer one); other failures raise."""
        for _ in range(3):
            try:
                return read()
            except (DitError, OSError):  # a config.yaml gone is a ConfigError
                newest = checkpoint_folder(self.run) if self.run is not None else None
                if newest is None or newest.resolve() == self.folder:
                    raise
                print(f"note: {self.folder.name} was removed while it was read (the run's checkpoint rotation); "
                      f"reading the run's newest, {newest.name}", file=sys.stderr)
                self.folder = newest.resolve()
        return read()

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
        from dit_trainer.config import build_config

        return self._read(lambda: build_config(str(self.config_file)))

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

            return self._read(lambda: read_sharded_model(self.folder))
        return self._read(lambda: load_weights(self.path, prefer_ema=which == "ema"))

    def __repr__(self):
        return f"CheckpointReader({str(self.path)!r})"


def open(path, flag=None) -> CheckpointReader:  # shadows the builtin here only: callers write checkpoint.open
    """A reader of `path`: a run folder (its newest checkpoint), a checkpoint folder or a weights file.

    A reader passed in comes back as it is; `flag` names where the path came from in errors.
    """
    if isinstance(path, CheckpointReader):
        return path
    found = resolve_checkpoint(path, flag)
    if not found.is_dir():
        return CheckpointReader(file=found)
    # A run folder (not a checkpoint folder itself): its rotation may remove what was found.
    return CheckpointReader(folder=found, run=None if found == Path(path) else path)
