"""A held-out split of the training data (`data.val_split`): samples training never reads, which the
validation loss, the validation grid and FID over prompts read instead.

The choice depends on the data's length and the count only (one fixed seed, not `train.seed`), so
every run of the same data holds out the same samples and their validation losses compare.
"""

import numpy as np
import torch

from dit_trainer.errors import ConfigError

HOLDOUT_SEED = 0x5EED


def split(n: int, count: int):
    """(held-out indices, kept indices), each ascending, of a dataset of `n` samples; count 0 keeps all
    (kept None: the sampler's draw stays the one without a split, bit for bit)."""
    count = int(count)
    if count <= 0:
        return np.empty(0, dtype=np.int64), None
    if count >= n:
        raise ConfigError(f"data.val_split {count} holds out every one of the {n} samples; hold out fewer")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(HOLDOUT_SEED)).numpy()
    return np.sort(perm[:count]), np.sort(perm[count:])
