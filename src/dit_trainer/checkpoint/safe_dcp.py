"""Reading DCP checkpoints without running anyone's code.

torch's `FileSystemReader.read_metadata` unpickles `dcp/.metadata` with plain `pickle.load`, and
`DefaultLoadPlanner.load_bytes` unpickles every byte item (our `trainer` blob) with
`torch.load(weights_only=False)`: a run folder handed over by someone else could execute code on
`dit train`. Here the metadata goes through an unpickler that resolves only the classes DCP's
`Metadata` is made of and fills only fresh instances of them, and byte items load with
`weights_only=True`. Anything else is a one-line `CheckpointError`.
"""

import io
import pickle
from pathlib import Path, PurePosixPath

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from dit_trainer.checkpoint.pt import weights_only_refusal
from dit_trainer.checkpoint.unpickle import PlainDataUnpickler
from dit_trainer.errors import CheckpointError, one_line
from dit_trainer.fs import check_regular

_MD = "torch.distributed.checkpoint.metadata"
# Exactly what `dcp.save` pickles into `.metadata` (torch 2.4 .. 2.13): the metadata dataclasses,
# the filesystem writer's per-item locations, tensor sizes, dtypes and layouts, and the path the
# checkpoint was saved under. None of these constructors touches anything outside the object.
ALLOWED = {
    (_MD, "Metadata"), (_MD, "MetadataIndex"), (_MD, "StorageMeta"), (_MD, "TensorStorageMetadata"),
    (_MD, "BytesStorageMetadata"), (_MD, "ChunkStorageMetadata"), (_MD, "TensorProperties"),
    (_MD, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("pathlib._local", "PosixPath"), ("pathlib._local", "WindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(PlainDataUnpickler):
    """Resolves only the allow-listed globals and torch dtypes, and fills only fresh metadata records."""

    def find_class(self, module, name):
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not part of DCP metadata")

    def buildable(self) -> tuple:
        """DCP's metadata records: the dataclasses a `.metadata` fills field by field."""
        from torch.distributed.checkpoint import metadata as md
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        return (md.Metadata, md.MetadataIndex, md.StorageMeta, md.TensorStorageMetadata, md.BytesStorageMetadata,
                md.ChunkStorageMetadata, md.TensorProperties, _StorageInfo)


def read_metadata_file(path):
    """The `Metadata` of a DCP `.metadata` file, refusing any pickle that is not plain DCP metadata."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    check_regular(path, CheckpointError, "DCP metadata")
    try:
        with open(path, "rb") as f:
            md = _MetadataUnpickler(f).load()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err}); the checkpoint is incomplete") from None
    except pickle.UnpicklingError as err:
        raise CheckpointError(f"{path}: refused, not DCP checkpoint metadata ({one_line(err)}); do not load checkpoints you do not trust") from None
    except Exception as err:  # truncated or garbled bytes: EOFError, ValueError, TypeError, ...
        raise CheckpointError(f"{path}: not readable DCP metadata ({type(err).__name__}); the checkpoint is damaged") from None
    if not isinstance(md, Metadata) or not isinstance(getattr(md, "state_dict_metadata", None), dict):
        raise CheckpointError(f"{path}: refused, holds {type(md).__name__} instead of DCP Metadata")
    storage = getattr(md, "storage_data", None)
    if not isinstance(storage, dict) or not all(isinstance(v, _StorageInfo) for v in storage.values()):
        raise CheckpointError(f"{path}: refused, its storage_data is not a map of DCP file locations")
    for info in storage.values():
        # Unpickling fills a dataclass from whatever state the bytes hold: a damaged file can leave
        # out a field the reader uses, or give it another type.
        if not (isinstance(getattr(info, "relative_path", None), str)
                and all(isinstance(getattr(info, f, None), int) for f in ("offset", "length"))):
            raise CheckpointError(f"{path}: refused, a storage_data entry lacks a file, offset or length; "
                                  "the checkpoint is damaged")
        # A location may only name a shard file beside `.metadata`, never a path elsewhere.
        rel = PurePosixPath(info.relative_path)
        if len(rel.parts) != 1 or rel.name in ("", ".", "..") or "\\" in rel.name:
            raise CheckpointError(f"{path}: refused, a shard location {info.relative_path!r} points outside the checkpoint")
        check_regular(Path(path).parent / rel.name, CheckpointError, "a DCP shard")
    return md


class SafeFileSystemReader(FileSystemReader):
    """`FileSystemReader` whose metadata goes through the restricted unpickler."""

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        md = read_metadata_file(self._get_metadata_path(kwargs.get("rank")))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class SafeLoadPlanner(DefaultLoadPlanner):
    """`DefaultLoadPlanner` that loads byte items (the trainer state) with `weights_only=True`."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            # DCP stores a byte item as torch.save(the BytesIO): only that wrapper is let through.
            with torch.serialization.safe_globals([io.BytesIO]):
                obj = torch.load(value, map_location="cpu", weights_only=True)
        except Exception as err:
            raise CheckpointError(f"DCP item {read_item.dest_index.fqn} refused: it {weights_only_refusal(err)}") from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
