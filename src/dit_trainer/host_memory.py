"""Reuse of freed host memory by glibc's malloc, for training and inference on a CPU.

glibc serves a block above its mmap threshold (which grows with the blocks freed, to at most
32 MiB on 64-bit) with a fresh mmap and returns it to the kernel on free. A DiT step frees and
allocates the same large activations every step, so every step would page-fault them back in as
zeroed pages, costing kernel time comparable to the step's own arithmetic on a small CPU. With
mmap off and the heap never trimmed, freed blocks stay in the heap and the next step reuses them
(the step's allocations repeat, so the heap stops growing after the first steps). The setting is
process-wide and glibc has no way back to its dynamic threshold, so it is applied once and left on.

The commands that compute on a CPU (`dit train`, `dit demo`, `dit sample`, `sample-ddp`, `eval`,
`extract`) apply it by themselves: inference frees each activation as the forward goes and faulted
as much. Where layer sizes vary (Inception, a VAE) blocks that do not fit the next request stay in
the heap, so the process keeps a larger heap than its peak of live tensors. Library code
(`DiTTrainer`, `sample_latents`, `run_extract`, ...) does not apply it: a process-wide setting is
the caller's.
"""

import ctypes
import platform

# mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# -1 disables trimming of the heap's top altogether (mallopt(3)). A finite threshold, even INT_MAX
# (2 GiB), is crossed where a forward frees more than that at once: an SD-size VAE encode of 8
# images at 256 px did, and its heap top went back to the kernel and faulted in again every batch.
_NEVER_TRIM = -1

_applied = False


def glibc_malloc() -> bool:
    """Whether this process allocates with glibc's malloc (Linux with glibc), the one mallopt tunes."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks for reuse instead of unmapping them; True once in effect."""
    global _applied
    if _applied:
        return True
    if not glibc_malloc():
        return False  # macOS, musl, Windows: other allocators, left as they are
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # Threads other than the main one allocate from arenas of at most 64 MiB, and above that glibc
    # still maps (it tries mmap when an arena cannot grow), so no allocation can fail for this.
    _applied = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _NEVER_TRIM))
    return _applied


def freed_memory_kept() -> bool:
    """Whether `keep_freed_memory` has taken effect in this process."""
    return _applied


def keep_freed_memory_on(device) -> bool:
    """Apply keep_freed_memory if `device` (a name, a torch.device, or None for CUDA when available,
    else CPU) is a CPU: the commands' one rule; True once in effect."""
    import torch

    try:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        kind = torch.device(device).type
    except (RuntimeError, TypeError, ValueError):
        return False  # the command's own device check reports it, in its words
    return kind == "cpu" and keep_freed_memory()
