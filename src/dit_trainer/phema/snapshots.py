"""Snapshot files of the post-hoc EMA profiles: `OUTPUT_DIR/phema/snapshot-XXXXXXXX.safetensors`.

A snapshot holds every profile's full weights at one step, named `<label>/<FQN>` (`std0.050/...`) in
`train.phema_dtype`, and the frozen parameters once as `frozen/<FQN>` in their own dtype, since
exporters check DiT's pos_embed against its exact table. Its metadata records the step and the
profiles. It is written under a temporary name and renamed, so a crash leaves the previous snapshots
and no partial one; snapshots sit outside `checkpoints/`, where rotation never reaches them.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

from dit_trainer.errors import CheckpointError, one_line
from dit_trainer.fs import check_regular, staged_file, write_error_text
from dit_trainer.phema.paths import FROZEN, list_snapshots, phema_root, snapshot_path

FORMAT = "dit-trainer phema snapshot 1"
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


def write_snapshot(tracker, output_dir, step: int):
    """Gather `tracker`'s profiles (every rank calls this) and write them on rank 0 as the snapshot of
    `step`; returns its path on rank 0, None elsewhere. A failed write is an error on every rank."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from dit_trainer.checkpoint.sharded import gather_full
    from dit_trainer.parallel.utils import any_rank

    dims, parts = tracker.dims, tracker.model_parts
    main = dims.is_main if dims is not None else True
    frozen = tracker.frozen_names()
    store = DTYPES[tracker.dtype]
    first = next(iter(tracker.profiles.values()))
    # Every rank joins each gather in the same order; pipeline stages send rank 0 their own names.
    tensors = {f"{FROZEN}/{n}": v for n, v in gather_full({n: t for n, t in first.shadow.items() if n in frozen},
                                                         parts, dims).items()}
    for label, ema in tracker.profiles.items():
        trained = gather_full({n: t for n, t in ema.shadow.items() if n not in frozen}, parts, dims)
        tensors.update({f"{label}/{n}": v.to(store).contiguous() for n, v in trained.items()})
    path = snapshot_path(output_dir, step)
    error = None
    if main:
        metadata = {"format": FORMAT, "step": str(int(step)), "stds": json.dumps(tracker.stds),
                    "labels": json.dumps(tracker.labels), "dtype": tracker.dtype}
        try:
            with staged_file(path, CheckpointError) as tmp:
                save_file(tensors, str(tmp), metadata=metadata)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())  # the rename must not overtake the data on a crash
        except CheckpointError as err:
            error = err
        except (OSError, RuntimeError, SafetensorError) as err:
            error = CheckpointError(f"{write_error_text(path, err)}; free space or fix permissions")
    if any_rank(error is not None, tracker.device or "cpu"):
        raise error or CheckpointError(f"cannot write {path}: rank 0 failed to write the post-hoc EMA snapshot")
    return path if main else None


class Snapshot:
    """One snapshot file, its header read and checked: `step`, `stds`, `labels`, `dtype`, tensor `names`."""

    def __init__(self, path, step: int):
        from safetensors import safe_open

        self.path, self.step = Path(path), int(step)
        check_regular(self.path, CheckpointError, "a post-hoc EMA snapshot")
        try:
            with safe_open(str(self.path), framework="pt") as f:
                meta, self.names = f.metadata() or {}, list(f.keys())
            if meta.get("format") != FORMAT:
                raise ValueError(f"its metadata format is {meta.get('format')!r}, not {FORMAT!r}")
            if int(meta["step"]) != self.step:
                raise ValueError(f"it records step {meta['step']}, not the {self.step} its name says")
            self.stds = [float(s) for s in json.loads(meta["stds"])]
            self.labels = [str(s) for s in json.loads(meta["labels"])]
            self.dtype = str(meta["dtype"])
            if len(self.stds) != len(self.labels) or not self.stds:
                raise ValueError("its metadata lists no profiles")
        except Exception as err:  # SafetensorError, OSError, a missing or garbled metadata entry
            raise damaged(self.path, one_line(err)) from None

    def tensor(self, handle, name: str, check_finite: bool = False) -> torch.Tensor:
        """Tensor `name` from an open `safe_open` handle of this file; `check_finite`: a NaN or inf is an error."""
        try:
            value = handle.get_tensor(name)
        except Exception as err:
            raise damaged(self.path, f"{name}: {one_line(err)}") from None
        if check_finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise damaged(self.path, f"{name} holds NaN or inf")
        return value


def damaged(path, why: str) -> CheckpointError:
    """The one-line error of a snapshot that cannot be used, and what to do about it."""
    return CheckpointError(f"{path}: not a usable post-hoc EMA snapshot ({why}); move it out of {Path(path).parent} "
                           "and rerun (the other snapshots still reconstruct, less finely)")


def set_aside_newer(output_dir, step: int):
    """Move the snapshots newer than `step` into `phema/abandoned-TIME/` (a run resumed from `step`, or
    started anew, writes its own); returns that folder, or None when there were none."""
    newer = [p for s, p in list_snapshots(output_dir) if s > step]
    if not newer:
        return None
    dest, n = phema_root(output_dir) / f"abandoned-{time.strftime('%Y%m%d-%H%M%S')}", 1
    while dest.exists():
        dest, n = dest.with_name(f"{dest.name.split('~')[0]}~{n}"), n + 1
    dest.mkdir()
    for path in newer:
        path.rename(dest / path.name)
    print(f"warning: moved the post-hoc EMA snapshots newer than step {step} ({', '.join(p.name for p in newer)}) "
          f"to {dest}: this run writes its own", file=sys.stderr)
    return dest
