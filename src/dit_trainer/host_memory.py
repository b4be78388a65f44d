"""Reuse of freed host memory by glibc's malloc, for training on a CPU.

glibc serves a block above its mmap threshold (which grows with the blocks freed, to at most
32 MiB on 64-bit) with a fresh mmap and returns it to the kernel on free. A DiT step frees and
allocates the same large activations every step (at DiT-S/2, batch 32, an fp32 MLP hidden state
is 48 MiB), so every step page-faults them back in as zeroed pages (benchmarks/train_step.py's
`+sysmalloc` row on a 2-core AVX2 CPU: 862,512 minor faults and 5.37 s of kernel CPU time per
compiled fp32 step). With mmap off and the heap's trim threshold high, freed blocks stay in the
heap and the next step reuses them: one fault per step there, for 3% more peak memory (the step's
allocations repeat, so the heap stops growing after the first steps). The setting is process-wide and
glibc has no way back to its dynamic threshold, so it is applied once and left on.
"""

import ctypes
import platform

# mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# mallopt takes an int: INT_MAX bytes (2 GiB) of free heap top before glibc trims it, which a step
# never frees at once, so the heap is not given back during a run.
_NEVER_TRIM = 2**31 - 1

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
