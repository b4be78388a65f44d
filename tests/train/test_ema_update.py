"""ema_decay_at: the decay each update uses, with and without warm-up."""

import pytest

from dit_trainer.train.ema import ema_decay_at


def test_warmup_averages_over_fewer_steps_early():
    # (1 + step) / (10 + step): 0.1 at the first update, reaching 0.9999 only after ~90,000 steps.
    assert ema_decay_at(0, 0.9999, True) == pytest.approx(0.1)
    assert ema_decay_at(90, 0.9999, True) == pytest.approx(0.91)
    assert ema_decay_at(10**6, 0.9999, True) == 0.9999
    assert [ema_decay_at(s, 0.9999, True) for s in range(5)] == sorted(ema_decay_at(s, 0.9999, True) for s in range(5))


def test_without_warmup_the_decay_is_constant():
    assert {ema_decay_at(s, 0.9999, False) for s in (0, 1, 10**6)} == {0.9999}
