"""Per-item helpers every dataset shares: index and epoch checks, and flips that are a pure
function of (seed, epoch, index) so that resumes and DataLoader workers agree."""

import numpy as np


def flip_for(seed: int, epoch: int, index: int) -> bool:
    """Whether item `index` is flipped in `epoch`: a pure function, so resume and workers agree."""
    return bool(np.random.default_rng([seed, epoch, index]).random() < 0.5)


def check_index(index, length: int) -> int:
    """`index` as a non-negative position (negative counts from the end), or IndexError."""
    index = int(index)
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for {length} items")
    return index


def check_epoch(epoch) -> int:
    """A non-negative integer epoch, or ValueError."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
    return int(epoch)


# What reading a damaged `.npy` raises: dit_trainer.npy's NpyError (a ValueError) for anything in its
# header or length, and OverflowError or MemoryError where a sound header asks for more than there is.
NPY_ERRORS = (ValueError, EOFError, OverflowError, MemoryError)
