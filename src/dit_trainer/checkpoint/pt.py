"""Reading `.pt` files weights-only, and telling in one line why one does not load: code it would need
to unpickle (planted, or a foreign training checkpoint), damage, or no torch file at all."""

import argparse
import pickle
import re
from pathlib import Path

import torch

from dit_trainer.errors import CheckpointError
from dit_trainer.fs import check_regular

# A checkpoint folder of a run (files.py lists them by it).
CKPT_RE = re.compile(r"^step-(\d{8})$")


def load_pt(path):
    """torch.load with weights_only=True; argparse.Namespace (in the release's training checkpoints) is allowed."""
    check_regular(path, CheckpointError)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise _unreadable_pt(Path(path), err) from None


# torch names the refused global as "GLOBAL module.name" in its weights-only errors.
_GLOBAL_RE = re.compile(r"GLOBAL (\S+)")
_DOTTED_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def _refused_global(err: BaseException):
    """The global a weights-only load refused, when the file really names one (else None).

    Garbled bytes in a pickle also end as a refused "global"; a name that is no identifier, or that a
    module already imported here does not have (a flipped torch._utils._rebuild_tensor_v2), is damage.
    """
    import sys

    if not isinstance(err, pickle.UnpicklingError):
        return None
    found = _GLOBAL_RE.search(str(err))
    name = found.group(1).rstrip(".") if found else ""
    if not _DOTTED_RE.fullmatch(name):
        return None
    module, _, attr = name.rpartition(".")
    if module in sys.modules and not hasattr(sys.modules[module], attr):
        return None
    return name


def weights_only_refusal(err: BaseException) -> str:
    """Why a weights-only load of a checkpoint's own pickle failed, told apart: planted code or damage."""
    code = _refused_global(err)
    if code:
        return (f"needs code to unpickle ({code}), which a weights-only load refuses; dit-trainer never writes "
                "code into checkpoints, so it was replaced: use another checkpoint")
    return f"is damaged ({type(err).__name__}); restore it or use another checkpoint"


def _unreadable_pt(path: Path, err: BaseException) -> CheckpointError:
    """Why a .pt does not load, in one line: code it needs, damage, or not a torch file at all."""
    if isinstance(err, FileNotFoundError):
        return CheckpointError(f"{path} does not exist; pass a .pt file or restore it from another checkpoint")
    code = _refused_global(err)
    if code:
        if CKPT_RE.match(path.parent.name):
            return CheckpointError(f"{path}: {weights_only_refusal(err)}")
        return CheckpointError(f"{path}: needs code to unpickle ({code}), which a weights-only load refuses; if you "
                               "trust its source, convert it to safetensors or a plain state dict")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as os_err:
        return CheckpointError(f"{path}: cannot be read ({os_err.strerror or type(os_err).__name__})")
    if not head:
        return CheckpointError(f"{path} is empty; re-download it or restore it from another checkpoint")
    # torch.save writes a zip archive (PK\x03\x04), or a pickle (protocol byte 0x80) in the legacy format.
    if head.startswith(b"PK\x03\x04") or head.startswith(b"\x80"):
        return CheckpointError(f"{path} is damaged or truncated ({type(err).__name__}); re-download it or restore "
                               "it from another checkpoint")
    return CheckpointError(f"{path} is not a torch file (no zip or pickle header); pass a file written by "
                           "torch.save or a .safetensors file")
