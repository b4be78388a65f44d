"""Prompt following on the captioned digits: the real digits follow their own captions, and a sample that shows
another digit, weight or slant than asked is counted as missing it, apart for seen and held-out prompts."""

import numpy as np
import pytest

from dit_trainer.data.digit_attributes import digit_captions
from dit_trainer.data.digits import load_digit_arrays, upsample_digits
from dit_trainer.evaluate.digit_prompts import prompt_following, table_lines


@pytest.fixture(scope="module")
def real():
    """Every real digit at 8×8 in [-1, 1] and what its caption says."""
    return upsample_digits(load_digit_arrays()[0], 8).numpy(), digit_captions()


def test_real_digits_follow_their_own_captions(real):
    images, known = real
    table = prompt_following(images, known.digits, known.weights, known.slants, known.thresholds)
    assert table["seen"]["n"] + table["held_out"]["n"] == 1797 and table["held_out"]["n"] == known.held_out.sum()
    for row in table.values():
        assert row["digit"] > 0.98 and row["weight"] == 1.0 and row["slant"] == 1.0
    lines = table_lines(table)
    assert lines[1].startswith("seen") and lines[2].startswith("held-out") and "%" in lines[2]


def test_a_wrong_attribute_or_digit_is_a_miss(real):
    images, known = real
    rows = np.flatnonzero(~known.held_out)[:200]
    digits, weights, slants = known.digits[rows], known.weights[rows], known.slants[rows]
    other = (weights + 1) % 3  # ask for another weight than the image shows
    table = prompt_following(images[rows], digits, other, slants, known.thresholds)["seen"]
    assert table["weight"] == 0.0 and table["all"] == 0.0 and table["slant"] == 1.0
    table = prompt_following(images[rows], (digits + 1) % 10, weights, slants, known.thresholds)["seen"]
    assert table["digit"] < 0.05
