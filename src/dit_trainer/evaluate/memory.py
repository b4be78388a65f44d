"""What `dit eval`'s stages that grow with the sample count will hold, said before they start and
refused in one line when it cannot fit, rather than the process being killed halfway.

Two stages grow with the number of samples N: the features of every sample (kept until the
statistics, IS and precision/recall are taken, plus the float64 copies the statistics make) and
precision/recall, whose distance blocks are at most `batch_size`² entries whatever N (see
precision_recall.py) plus a few bytes per point. The estimates bound what the process grows by
while those stages run, their temporaries and device copies counted (tests/evaluate measure the
peak resident memory of precision/recall against it); torch and the network come on top.
"""

import os
import resource
from typing import Optional, Tuple

from dit_trainer.errors import ResourceError
from dit_trainer.evaluate.precision_recall import BLOCK, GROUP, workspace_bytes

GB = 1e9
ALLOCATOR_SLACK = 8 * 2**20  # what the host allocator keeps of a stage's small, short-lived tensors


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _cgroup_headroom() -> Optional[int]:
    """The memory cgroup's limit less its usage (v2, else v1); None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            limit, used = _read_int(os.path.join(base, "memory.max")), _read_int(os.path.join(base, "memory.current"))
        elif "memory" in controllers.split(","):
            base = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            limit = _read_int(os.path.join(base, "memory.limit_in_bytes"))
            used = _read_int(os.path.join(base, "memory.usage_in_bytes"))
            if limit is not None and limit >= 2**60:  # v1's "no limit" is a huge number
                limit = None
        else:
            continue
        if limit is not None and used is not None:
            return max(0, limit - used)
    return None


def _address_space_headroom() -> Optional[int]:
    """RLIMIT_AS less the address space already mapped; None without a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None
    return max(0, soft - size)


def available_bytes(device="cpu") -> Optional[int]:
    """Bytes that can still be allocated on `device`: a GPU's free memory, or on the host the least of
    MemAvailable, the memory cgroup's headroom and RLIMIT_AS's; None where nothing says."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    known = [b for b in (_meminfo_available(), _cgroup_headroom(), _address_space_headroom()) if b is not None]
    return min(known) if known else None


def feature_bytes(n: int, dims: Tuple[int, int, int]) -> int:
    """The features of `n` samples (pool, spatial, logits widths `dims`) with the statistics' copies."""
    pool, spatial, logits = dims
    # float32 features; np.cov's two float64 copies of the wider set; IS's float64 softmax arrays.
    return n * (4 * (pool + spatial + logits) + max(16 * max(pool, spatial), 32 * logits))


def pr_bytes(n_ref: int, n_samples: int, dim: int, batch_size: int = BLOCK, dtype: str = "fp16", device="cpu",
             k: int = 3) -> int:
    """Precision/recall of `n_samples` against `n_ref` points of `dim` features on `device`: the
    largest distance block's buffers, what one block allocates beside them, radii and flags per
    point, and the float32 features copied to a device other than the host."""
    side = min(batch_size, max(n_ref, n_samples))
    # Beside the buffers, per block: its group minima (and the heap pages the last block's minima
    # left), each row's candidates for its k + 1 nearest, and the allocator's few MB of small blocks.
    transient = 2 * side * side * 4 // GROUP + side * (GROUP + 2) * (k + 1) * 12 + ALLOCATOR_SLACK
    per_point = 4 + 1  # float32 radius, bool inside the other manifold
    # Host float32 features are used in place; another device gets its own float32 copy of both sets.
    copies = 0 if str(device).split(":")[0] == "cpu" else 4 * dim
    return workspace_bytes(side, side, dtype, masks=True, dim=dim) + transient + (n_ref + n_samples) * (per_point + copies)


def _gb(n: int) -> str:
    return f"{n / GB:.1f} GB" if n >= 0.1 * GB else f"{n / 2**20:.0f} MB"


def check_eval_memory(samples, n: int, dims: Tuple[int, int, int], n_ref: Optional[int], device="cpu",
                      batch_size: int = BLOCK, dtype: str = "fp16") -> str:
    """The line saying what the samples' features and precision/recall (n_ref None: skipped) will
    hold; ResourceError naming what to do when they cannot fit in what is available."""
    features = feature_bytes(n, dims)
    pr = 0 if n_ref is None else pr_bytes(n_ref, n, dims[0], batch_size, dtype, device)
    host = available_bytes("cpu")
    # Features stay on the host; precision/recall runs on `device`, beside them when that is the host.
    on_host = str(device).split(":")[0] == "cpu"
    room = host if on_host else available_bytes(device)
    pr_text = "skipped" if n_ref is None else f"about {_gb(pr)} (distance blocks of up to {batch_size:,}²)"
    line = f"{n:,} samples: features and their statistics about {_gb(features)}, precision/recall {pr_text}"
    if host is not None:
        line += f"; {_gb(host)} available" + ("" if on_host or room is None else f", {_gb(room)} on {device}")
    if host is not None and features > host:
        raise ResourceError(f"{samples}: the features of {n:,} samples and their statistics need about "
                            f"{_gb(features)} but {_gb(host)} is available; evaluate fewer samples at once "
                            f"or free memory")
    if room is not None and pr + (features if on_host else 0) > room:
        beside = f" beside the features' {_gb(features)}" if on_host else f" on {device}"
        raise ResourceError(f"{samples}: precision/recall needs about {_gb(pr)}{beside} but {_gb(room)} is "
                            f"available; pass --no-pr to skip it, or free memory")
    return line
