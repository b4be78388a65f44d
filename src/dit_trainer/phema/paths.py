"""Where post-hoc EMA lives in a run folder, torch-free: `OUTPUT_DIR/phema/snapshot-XXXXXXXX.safetensors`
(the profiles stored during training) and `OUTPUT_DIR/phema/stdS-stepXXXXXXXX/` (a reconstruction,
a checkpoint folder that sampling, evaluation and conversion read)."""

import re
from pathlib import Path

SNAPSHOT_RE = re.compile(r"^snapshot-(\d{8})\.safetensors$")
# Tensor names of a snapshot: "<label>/<parameter FQN>" per profile, "frozen/<FQN>" once for the
# parameters training never changes (kept in their own dtype: exporters check DiT's pos_embed exactly).
FROZEN = "frozen"


def std_label(std: float) -> str:
    """`std0.050`: sigma_rel with three decimals, or as many more as it takes to name it exactly,
    so two widths never share a label (a tensor prefix, a folder name)."""
    std = float(std)
    for digits in range(3, 18):
        text = f"{std:.{digits}f}"
        if float(text) == std:
            return f"std{text}"
    return f"std{std!r}"


def phema_root(run_dir) -> Path:
    """The folder of a run's snapshots and reconstructions."""
    return Path(run_dir) / "phema"


def snapshot_path(run_dir, step: int) -> Path:
    """The snapshot file of `step`."""
    return phema_root(run_dir) / f"snapshot-{int(step):08d}.safetensors"


def phema_folder(run_dir, std: float, step: int) -> Path:
    """The checkpoint folder `dit ema` writes for width `std` at `step`, e.g. `RUN/phema/std0.080-step00001200`."""
    return phema_root(run_dir) / f"{std_label(std)}-step{int(step):08d}"


def list_snapshots(run_dir) -> list:
    """(step, path) of every snapshot of a run, oldest first (temporary files are not listed)."""
    root = phema_root(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := SNAPSHOT_RE.match(p.name)) and p.is_file()]
    return sorted(found)
