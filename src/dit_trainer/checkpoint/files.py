"""Checkpoints: one directory per step, written under a temporary name and renamed.

`step-00000100/` holds `model.safetensors`, `ema.safetensors`, `optimizer.pt`,
`trainer_state.pt` and `config.yaml`. Only tensors and plain containers are pickled, so
everything loads with `torch.load(weights_only=True)`.
"""

import argparse
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dit_trainer.errors import CheckpointError

CKPT_RE = re.compile(r"^step-(\d{8})$")


def checkpoint_root(output_dir) -> Path:
    """Where checkpoints of a run live."""
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir) -> list[Path]:
    """Finished checkpoints of a run, oldest first (temporary directories are ignored)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and CKPT_RE.match(p.name)]
    return sorted(found, key=lambda p: int(CKPT_RE.match(p.name).group(1)))


def latest_checkpoint(output_dir):
    """The newest finished checkpoint, or None."""
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def _contiguous(sd: dict) -> dict:
    # safetensors refuses shared or strided storage; clone what is not a plain tensor.
    return {k: v.detach().contiguous().clone() if not v.is_contiguous() else v.detach() for k, v in sd.items()}


def begin_checkpoint(output_dir, step: int) -> Path:
    """A fresh temporary directory for the checkpoint of `step`; `commit_checkpoint` publishes it."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"step-{step:08d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def commit_checkpoint(tmp: Path, keep: int = 0) -> Path:
    """Rename a finished temporary directory to its final name; keep the newest `keep` (0 keeps all)."""
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep > 0:
        for old in list_checkpoints(final.parent.parent)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def save_checkpoint(output_dir, step: int, files: dict, keep: int = 0) -> Path:
    """Write one checkpoint atomically and keep only the newest `keep` (0 keeps all).

    `files` maps file names to content: `*.safetensors` take a state dict of tensors,
    `*.pt` any weights-only-loadable object, `*.yaml`/`*.json` a string.
    """
    tmp = begin_checkpoint(output_dir, step)
    for name, content in files.items():
        path = tmp / name
        if name.endswith(".safetensors"):
            save_file(_contiguous(content), str(path))
        elif name.endswith(".pt"):
            torch.save(content, path)
        else:
            path.write_text(content)
    return commit_checkpoint(tmp, keep)


def load_pt(path):
    """torch.load with weights_only=True; argparse.Namespace (in the release's training checkpoints) is allowed."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path}: cannot be read as a weights-only torch file ({type(err).__name__}); "
                              "convert it to safetensors or a plain state dict") from None


def load_weights(path, prefer_ema: bool = True) -> dict:
    """A model state dict from our checkpoint dir, a safetensors file, or an original DiT `.pt`.

    From a checkpoint directory the EMA weights are taken (what sampling uses) unless
    `prefer_ema` is False. A DiT training checkpoint (`{"model", "ema", "opt", "args"}`) gives its EMA.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"weights path {path} does not exist; pass a checkpoint directory, .pt or .safetensors file")
    if p.is_dir():
        names = ["ema.safetensors", "model.safetensors"] if prefer_ema else ["model.safetensors", "ema.safetensors"]
        for name in names:
            if (p / name).is_file():
                return load_file(str(p / name))
        raise CheckpointError(f"{path} holds no model.safetensors or ema.safetensors; is it a dit-trainer checkpoint?")
    if p.suffix == ".safetensors":
        return load_file(str(p))
    obj = load_pt(p)
    if isinstance(obj, dict) and "ema" in obj and isinstance(obj["ema"], dict):
        obj = obj["ema"] if prefer_ema or "model" not in obj else obj["model"]
    elif isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} is not a state dict of tensors")
    # Checkpoints saved from DDP carry a "module." prefix.
    return {k.removeprefix("module."): v for k, v in obj.items()}


def load_into(model: torch.nn.Module, state_dict: dict, source) -> None:
    """load_state_dict(strict=True) with a one-line error naming the source and the mismatch."""
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    wrong = [k for k in own if k in state_dict and tuple(state_dict[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:3]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:3]}")
        if wrong:
            k = wrong[0]
            parts.append(f"shape of {k} is {tuple(state_dict[k].shape)} but the model has {tuple(own[k].shape)}")
        raise CheckpointError(f"{source} does not fit this model ({'; '.join(parts)}); check model.name, input_size, num_classes and learn_sigma")
    model.load_state_dict(state_dict, strict=True)
