"""Checkpoints: one directory per step, written under a temporary name and renamed.

`step-00000100/` holds `model.safetensors`, `ema.safetensors`, `optimizer.pt`,
`trainer_state.pt` and `config.yaml`. Only tensors and plain containers are pickled, so
everything loads with `torch.load(weights_only=True)`. `manifest.json`, written last before the
rename, holds each file's size and sha256, so a truncated or flipped file is found before use.
"""

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dit_trainer.checkpoint.pt import CKPT_RE, load_pt
from dit_trainer.errors import CheckpointError
from dit_trainer.fs import check_regular, write_error_text


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


# The files a checkpoint folder holds its weights in; a folder with neither is a run's output_dir.
WEIGHT_FILES = ("ema.safetensors", "model.safetensors")


def checkpoint_folder(path):
    """The checkpoint folder `path` names: itself when it holds weights, else (a run's output_dir) its
    newest checkpoint; None when it is neither."""
    path = Path(path)
    if any((path / name).is_file() for name in WEIGHT_FILES):
        return path
    return latest_checkpoint(path)


def resolve_checkpoint(path, flag=None) -> Path:
    """The checkpoint folder or weights file `path` names (a run folder gives its newest checkpoint),
    or a one-line error; `flag` names where the path came from (e.g. --ckpt)."""
    named = f"{flag} {path}" if flag else str(path)
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{named} does not exist; pass a run folder, a checkpoint folder or a DiT .pt/.safetensors file")
    if not p.is_dir():
        return p
    folder = checkpoint_folder(p)
    if folder is None:
        # With a config.yaml: a run stopped before its first save (or a step folder that lost its weights).
        started = (p / "config.yaml").is_file()
        raise CheckpointError(
            f"{named} {'has a config.yaml but no checkpoint yet' if started else 'holds no checkpoint'}: no "
            f"model.safetensors, ema.safetensors or checkpoints/step-*; pass a dit-trainer run folder "
            f"{'that has saved one (checkpoint.save_steps) ' if started else ''}or one of its checkpoints/step-* folders")
    return folder


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


MANIFEST = "manifest.json"


def _sha256(path: Path, sync: bool = False) -> str:
    check_regular(path, CheckpointError, "a checkpoint file")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
        if sync:
            # The rename that publishes the checkpoint must not overtake the data on a crash.
            os.fsync(f.fileno())
    return h.hexdigest()


def write_manifest(folder: Path) -> Path:
    """Record size and sha256 of every file under `folder` in `manifest.json` (call it last)."""
    folder = Path(folder)
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(folder).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path, sync=True)}
    out = folder / MANIFEST
    out.write_text(json.dumps({"format": 1, "files": files}, indent=1))
    with open(out, "rb") as f:
        os.fsync(f.fileno())
    return out


def verify_file(folder, name: str) -> None:
    """Check one file of a checkpoint against its manifest (nothing to check without one)."""
    folder = Path(folder)
    check_regular(folder / MANIFEST, CheckpointError, "a checkpoint manifest")
    try:
        info = json.loads((folder / MANIFEST).read_text())["files"][name]
        size, digest = int(info["size"]), str(info["sha256"])
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"{folder / MANIFEST} is damaged or does not list {name}") from None
    path = folder / name
    if path.stat().st_size != size or _sha256(path) != digest:
        raise CheckpointError(f"{path} fails its checksum (truncated or changed); use another checkpoint")


def verify_checkpoint(folder) -> None:
    """Raise CheckpointError unless every file of `folder`'s manifest is there, whole and unchanged.

    A folder without a manifest (written before manifests existed) must at least hold its weights.
    """
    folder = Path(folder)
    man = folder / MANIFEST
    for path in folder.rglob("*"):
        # A FIFO would block the reader below in open(), where no signal ends the wait.
        if not path.is_dir():
            check_regular(path, CheckpointError, "in a checkpoint")
    if not man.is_file():
        if not ((folder / "dcp" / ".metadata").is_file() or (folder / "model.safetensors").is_file()):
            raise CheckpointError(f"{folder} is incomplete: no {MANIFEST} and no weights")
        return
    try:
        files = json.loads(man.read_text())["files"]
        items = [(str(rel), int(info["size"]), str(info["sha256"])) for rel, info in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise CheckpointError(f"{man} is damaged (not a checkpoint manifest)") from None
    for rel, size, digest in items:
        path = folder / rel
        if ".." in Path(rel).parts or not path.is_file():
            raise CheckpointError(f"{folder} is incomplete: {rel} is missing")
        if path.stat().st_size != size:
            raise CheckpointError(f"{path} is truncated or changed: {path.stat().st_size} bytes, the manifest says {size}")
        if _sha256(path) != digest:
            raise CheckpointError(f"{path} fails its sha256 checksum: the file is damaged")


def write_failed(tmp: Path, err: BaseException, needed=None) -> CheckpointError:
    """Remove a half-written checkpoint and say in one line why it could not be written: the path,
    the cause and the bytes it needs (`needed`, about the previous checkpoint's size)."""
    shutil.rmtree(tmp, ignore_errors=True)
    return CheckpointError(f"{write_error_text(tmp, err, needed).replace('cannot write ', 'cannot write checkpoint ', 1)}; "
                           "free space or fix permissions (the previous checkpoint is kept)")


# What a failed write raises: OSError, torch.save's RuntimeError "[enforce fail at inline_container.cc]
# ... file write failed" and safetensors' SafetensorError "... (os error 28)".
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


def step_of(path) -> int:
    """The step a `step-XXXXXXXX` folder holds."""
    return int(CKPT_RE.match(Path(path).name).group(1))


def commit_checkpoint(tmp: Path, keep: int = 0, whole=None, keep_steps=()) -> Path:
    """Rename a finished temporary directory to its final name, then rotate: keep the newest `keep`
    checkpoints that verify (0 keeps all) and delete the ones older than those, except the steps in
    `keep_steps` (kept on purpose, e.g. an autoguidance guide; they do not count toward `keep`).

    Rotation never deletes the newest verified checkpoint, and a checkpoint that fails its manifest
    (a truncated newer one, say) is never kept in a good one's place: it does not count. `whole` is
    a set of checkpoint names already known whole (the caller's cache); the one committed joins it.
    """
    with COMMIT_LOCK:
        return _commit(tmp, keep, whole, keep_steps)


# Held while a checkpoint is renamed into place and older ones are deleted: a forced exit (the
# heartbeat watchdog's) waits for it, so it never leaves a rotation half done.
COMMIT_LOCK = threading.Lock()


def _commit(tmp: Path, keep: int, whole, keep_steps) -> Path:
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    whole = set() if whole is None else whole
    whole.add(final.name)
    if keep > 0:
        good = 0
        kept = {int(k) for k in keep_steps}
        for path in reversed(list_checkpoints(final.parent.parent)):
            if step_of(path) in kept:
                continue
            if good >= keep:
                shutil.rmtree(path, ignore_errors=True)
            elif path.name in whole or _verifies(path):
                whole.add(path.name)
                good += 1
    return final


def _verifies(path) -> bool:
    try:
        verify_checkpoint(path)
        return True
    except CheckpointError:
        return False


class Writers:
    """The processes that write one checkpoint: rank 0 (`is_main`) creates, signs and commits its
    folder; `any_failed(flag)` tells every rank whether any rank's flag is set (a collective);
    `barrier()` waits for all. The default is one process writing alone."""

    def __init__(self, is_main: bool = True, any_failed=bool, barrier=lambda: None):
        self.is_main, self.any_failed, self.barrier = is_main, any_failed, barrier


def save_checkpoint(output_dir, step: int, files: dict, keep: int = 0, whole=None, needed=None, shards=None,
                    writers=None, keep_steps=()) -> Path:
    """Write checkpoint `step` atomically, the one way every checkpoint is written: begin (a fresh
    `step-XXXXXXXX.tmp`), write, manifest, commit (rename, then rotate as `commit_checkpoint` does;
    `keep` 0 keeps all, `keep_steps` kept besides).

    `files` maps file names to content, written by rank 0: `*.safetensors` take a state dict of
    tensors, `*.pt` any weights-only-loadable object, `*.yaml`/`*.json` a string. `shards(tmp)`, when
    given, writes every rank's share first (DCP shards); then all ranks of `writers` call this, and
    they agree after each stage, so a failure on one rank is an error on all, never a hang. `needed`:
    the bytes the checkpoint will take (about the previous one's size), named when the disk is full.
    """
    writers = writers or Writers()
    main = writers.is_main
    tmp = checkpoint_root(output_dir) / f"step-{step:08d}.tmp"
    error = None
    if main:
        try:
            begin_checkpoint(output_dir, step)
        except OSError as err:
            error = write_failed(tmp, err, needed)
    # Every rank learns whether the folder exists before writing into it.
    if writers.any_failed(error is not None):
        raise error or CheckpointError(f"cannot write checkpoint {tmp}: rank 0 could not create it")
    try:
        if shards is not None:
            shards(tmp)
        if main:
            _write_files(tmp, files)
            write_manifest(tmp)
    except WRITE_ERRORS as err:
        error = write_failed(tmp, err, needed) if main else CheckpointError(f"cannot write checkpoint {tmp}: {err}")
    if writers.any_failed(error is not None):
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise error or CheckpointError(f"cannot write checkpoint {tmp}: another rank failed to write its shards")
    final = commit_checkpoint(tmp, keep, whole, keep_steps) if main else tmp.with_name(tmp.name.removesuffix(".tmp"))
    writers.barrier()
    return final


def _write_files(folder: Path, files: dict) -> None:
    for name, content in files.items():
        path = folder / name
        if name.endswith(".safetensors"):
            save_file(_contiguous(content), str(path))
        elif name.endswith(".pt"):
            torch.save(content, path)
        else:
            path.write_text(content)


def load_safetensors(path) -> dict:
    """safetensors.load_file with a one-line CheckpointError for a missing, truncated or garbled file."""
    check_regular(path, CheckpointError, "a weights file")
    try:
        return load_file(str(path))
    except Exception as err:  # SafetensorError, OSError, ...
        text = str(err).strip().splitlines()
        raise CheckpointError(f"{path}: cannot be read as safetensors ({text[-1] if text else type(err).__name__})") from None


def load_weights(path, prefer_ema: bool = True) -> dict:
    """A model state dict from our checkpoint dir, a safetensors file, or an original DiT `.pt`.

    A run folder gives its newest checkpoint. From a checkpoint directory the EMA weights are taken (what sampling uses) unless
    `prefer_ema` is False; then a folder without `model.safetensors` (a sharded or converted one) is an error, never
    its EMA. A DiT training checkpoint (`{"model", "ema", "opt", "args"}`) gives its EMA.
    """
    # A run folder gives its newest checkpoint, as `dit sample --ckpt RUN_DIR` takes.
    p = resolve_checkpoint(path, "weights path")
    if p.is_dir():
        names = ["ema.safetensors", "model.safetensors"] if prefer_ema else ["model.safetensors", "ema.safetensors"]
        if not prefer_ema and not (p / "model.safetensors").is_file():
            # Taking ema.safetensors instead would hand back other weights than asked for, without a word.
            if (p / "dcp").is_dir():
                raise CheckpointError(f"{p} is a sharded checkpoint: its training weights are in dcp/, not in a "
                                      "model.safetensors; read them into a built model with checkpoint.sharded."
                                      "load_sharded_model (as dit sample --weights model does), or take its EMA")
            if (p / "ema.safetensors").is_file():
                raise CheckpointError(f"{p} holds only ema.safetensors (a converted or exported folder keeps the EMA "
                                      "alone), no training weights; take the EMA (--weights ema) or pass the run's "
                                      "own checkpoint")
        for name in names:
            if (p / name).is_file():
                # Flipped bytes in a checkpoint would otherwise sample black images and exit 0.
                verify_file(p, name)
                return _finite(load_safetensors(p / name), p / name)
        raise CheckpointError(f"{p} holds no model.safetensors or ema.safetensors; use another checkpoint")
    if p.suffix == ".safetensors":
        return _finite(load_safetensors(p), p)
    obj = load_pt(p)
    if isinstance(obj, dict) and "ema" in obj and isinstance(obj["ema"], dict):
        if not prefer_ema and not isinstance(obj.get("model"), dict):
            raise CheckpointError(f"{path} holds EMA weights only (no 'model' entry); take the EMA (--weights ema)")
        obj = obj["ema"] if prefer_ema else obj["model"]
    elif isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} is not a state dict of tensors")
    # Checkpoints saved from DDP carry a "module." prefix.
    return _finite({k.removeprefix("module."): v for k, v in obj.items()}, path)


def _finite(sd: dict, source) -> dict:
    """`sd` itself, or a CheckpointError naming the first tensor holding NaN or inf."""
    for key, value in sd.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{source}: {key} holds NaN or inf; use another checkpoint")
    return sd


def mismatch(want: dict, state_dict: dict, model: str = "the model") -> str:
    """How `state_dict` differs from the shapes `want` ({name: shape}) of `model`, in one line
    (the first tensor of another shape, then up to three missing and unexpected names); "" if it fits."""
    wrong = [k for k in want if k in state_dict and tuple(state_dict[k].shape) != tuple(want[k])]
    missing = [k for k in want if k not in state_dict]
    unexpected = [k for k in state_dict if k not in want]
    parts = [f"{wrong[0]} is {tuple(state_dict[wrong[0]].shape)} but {model} has {tuple(want[wrong[0]])}"] if wrong else []
    if missing:
        parts.append(f"missing {', '.join(missing[:3])}")
    if unexpected:
        parts.append(f"unexpected {', '.join(unexpected[:3])}")
    return "; ".join(parts)


def dtype_mismatch(want: dict, state_dict: dict, exact: bool = False) -> str:
    """The first tensor of `state_dict` whose dtype cannot stand for `want`'s ({name: dtype}), in words;
    "" if none. `exact`: any other dtype (a training checkpoint holds what the run keeps); else only
    integers or bools for floating weights, which a cast would silently turn into whole numbers."""
    for key, dtype in want.items():
        got = state_dict.get(key)
        if not isinstance(got, torch.Tensor) or got.dtype == dtype:
            continue
        if exact or (dtype.is_floating_point and not got.dtype.is_floating_point):
            name = lambda d: str(d).removeprefix("torch.")  # noqa: E731
            return f"{key} is {name(got.dtype)} but the model keeps it as {name(dtype)}"
    return ""


def load_into(model: torch.nn.Module, state_dict: dict, source, exact_dtype: bool = False) -> None:
    """load_state_dict(strict=True) with a one-line error naming the source and the mismatch (shape, or a
    dtype a cast would change: any other with `exact_dtype`, else integers for floating weights)."""
    own = model.state_dict()
    problem = mismatch({k: v.shape for k, v in own.items()}, state_dict)
    if problem:
        raise CheckpointError(f"{source} does not fit this model ({problem}); check model.name, input_size, "
                              "num_classes and learn_sigma")
    problem = dtype_mismatch({k: v.dtype for k, v in own.items()}, state_dict, exact_dtype)
    if problem:
        raise CheckpointError(f"{source}: {problem}; the file was changed or written by another tool, use "
                              "another checkpoint")
    model.load_state_dict(state_dict, strict=True)
