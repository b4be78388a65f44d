"""`data.val_split`: a fixed choice of samples training never reads, independent of the run's seed, and a
resume that would hold out other samples refused in one line."""

import numpy as np
import pytest
import torch

from dit_trainer.data import holdout
from dit_trainer.data.loader import GlobalBatchSampler, StepLoader
from dit_trainer.errors import ConfigError, DataError


def test_training_never_reads_a_held_out_sample_and_no_split_draws_as_before():
    held, kept = holdout.split(40, 8)
    assert len(held) == 8 and sorted(set(held) | set(kept)) == list(range(40)) and not set(held) & set(kept)
    assert np.array_equal(held, holdout.split(40, 8)[0])  # the same samples for every run of the data
    read = [i for seed in (0, 1) for b in GlobalBatchSampler(40, 8, seed=seed, kept=kept) for i in b]
    assert len(read) == 2 * 32 and not set(read) & set(held)
    # Without a split the sampler's order is the one it always drew, bit for bit.
    assert holdout.split(40, 0)[1] is None
    assert list(GlobalBatchSampler(40, 8, seed=3, kept=None)) == list(GlobalBatchSampler(40, 8, seed=3))
    assert "held_out" not in GlobalBatchSampler(40, 8).state_dict()


def test_holding_out_everything_is_one_line():
    with pytest.raises(ConfigError, match="data.val_split 40 holds out every one of the 40 samples"):
        holdout.split(40, 40)


def test_a_resume_with_another_split_is_refused():
    _, kept = holdout.split(40, 8)
    saved = StepLoader(list(range(40)), GlobalBatchSampler(40, 8, kept=kept))
    next(saved)
    state = saved.state_dict()
    assert state["held_out"] == 8
    other = StepLoader(list(range(40)), GlobalBatchSampler(40, 8, kept=holdout.split(40, 4)[1]))
    other.load_state_dict(state)
    with pytest.raises(DataError) as err:
        next(other)
    assert "set data.val_split 8" in str(err.value) and "\n" not in str(err.value)
    same = StepLoader(list(range(40)), GlobalBatchSampler(40, 8, kept=kept))
    same.load_state_dict(state)
    assert torch.equal(next(same), next(saved))  # the step after the saved one
