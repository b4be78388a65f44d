"""What a digit shows, measured from its pixels: stroke weight and slant, their tertiles, the captions."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dit_trainer.data.digit_attributes import (HELD_OUT, MARGIN, caption, caption_words, classify, clear_of_cuts,
                                               digit_captions, fit_thresholds, is_held_out, measure)


def _images(ink):
    """N×1×8×8 images in [-1, 1] from N×8×8 ink in [0, 1]."""
    return torch.as_tensor(np.asarray(ink, dtype=np.float32))[:, None] * 2 - 1


def _bar(width: int = 1):
    """An 8×8 vertical bar `width` pixels wide."""
    ink = np.zeros((8, 8), dtype=np.float32)
    ink[:, 3:3 + width] = 1
    return ink


def test_slant_is_the_ink_shear_with_its_sign():
    diagonal = np.eye(8, dtype=np.float32)[:, ::-1]  # top right to bottom left: one column per row
    mass, slant = measure(_images([_bar(), diagonal, diagonal[:, ::-1]]))
    assert mass.tolist() == [8, 8, 8]
    assert slant[0] == pytest.approx(0, abs=1e-9)
    assert slant[1] == pytest.approx(1.0) and slant[2] == pytest.approx(-1.0)  # leaning right, its mirror left


def test_weight_counts_ink_on_the_digits_levels():
    thin, bold = _bar(1), _bar(2)
    mass, slant = measure(_images([thin, bold, bold * 0.5]))
    assert mass.tolist() == [8, 16, 8]
    assert slant.tolist() == [0, 0, 0]
    # Faint noise under half a level is no ink: the measures are those of the clean stroke.
    rng = np.random.default_rng(0)
    noisy = np.clip(thin + rng.uniform(-0.4, 0.4, thin.shape) / 16, 0, 1)
    assert [float(v[0]) for v in measure(_images([noisy]))] == [8, 0]


def test_upsampled_images_measure_as_their_8x8_digit():
    ink = np.zeros((8, 8), dtype=np.float32)
    ink[1:7, 2] = 1
    ink[1, 2:6] = 0.75
    ink[4, 3:5] = 0.5
    x8 = _images([ink])
    x16 = F.interpolate(x8, scale_factor=2, mode="nearest")
    assert [v.tolist() for v in measure(x8)] == [v.tolist() for v in measure(x16)]


def test_blank_and_nan_images_measure_as_no_ink():
    mass, slant = measure(torch.stack([-torch.ones(1, 8, 8), torch.full((1, 8, 8), float("nan"))]))
    assert mass.tolist() == [0, 0] and slant.tolist() == [0, 0]


def test_tertiles_give_every_digit_every_weight_and_slant_in_thirds():
    known = digit_captions()
    for d in range(10):
        mine = known.digits == d
        for values in (known.weights[mine], known.slants[mine]):
            counts = np.bincount(values, minlength=3)
            assert counts.min() >= mine.sum() // 3 - 2 and counts.max() <= mine.sum() // 3 + 3


def test_classify_cuts_at_each_digits_own_tertiles():
    base = np.arange(1.0, 13)  # each digit's 12 masses: tertiles of mass / median at 4.67 and 8.33 for 1..12
    scale = np.where(np.arange(10) == 1, 10.0, 1.0)  # the ones are ten times heavier
    mass = np.concatenate([base * k for k in scale])
    slant = np.tile(base - 7, 10)  # -6..5: tertiles at -2.33 and 1.33
    t = fit_thresholds(mass, slant, np.repeat(np.arange(10), 12))
    w, s = classify(np.array([2.0, 6.5, 11, 6.5]), np.array([-5.0, 0, 4, 0]), np.array([0, 0, 0, 1]), t)
    assert w.tolist() == [0, 1, 2, 0] and s.tolist() == [0, 1, 2, 1]  # 6.5 is regular for a zero, thin for a one


def test_captions_say_what_hand_checked_digits_show():
    # Looked at by eye (load_digit_arrays()[0][i]): 1626 a one-pixel-wide vertical one; 818 a one three pixels
    # wide; 745 a one whose top is right of its foot; 558 a one whose top is left of its base; 1078 a thin zero
    # whose top is left of its bottom; 1113 a heavy seven leaning right.
    known = digit_captions()
    assert known.prompts[1626] == "a thin upright one"
    assert known.prompts[818] == "a bold upright one"
    assert known.prompts[745].endswith("right-slanted one") and known.prompts[558].endswith("left-slanted one")
    assert known.prompts[1078] == "a thin left-slanted zero"
    assert known.prompts[1113] == "a bold right-slanted seven"
    # Plain cases: training reads the same words; the ones' slant is near enough a cut to go unsaid.
    assert all(known.captions[i] == known.prompts[i] for i in (1078, 1113))
    assert (known.captions[1626], known.captions[818]) == ("a thin one", "a bold one")


def test_near_calls_leave_the_attribute_unsaid():
    values = np.arange(30.0)  # ranks (i + 0.5) / 30: 9.5 and 10.5 are within 0.06 of 1/3, 19.5 and 20.5 of 2/3
    clear = clear_of_cuts(values, np.zeros(30, dtype=np.int64), 0.06)
    assert np.flatnonzero(~clear).tolist() == [8, 9, 10, 11, 18, 19, 20, 21]
    assert clear_of_cuts(values, np.zeros(30, dtype=np.int64), 0.0).all()
    assert caption(7, None, 2) == "a right-slanted seven" and caption(7, 0, None) == "a thin seven"
    assert caption(7) == "a seven"
    known = digit_captions()
    partial = [i for i, (c, p) in enumerate(zip(known.captions, known.prompts)) if c != p]
    # Each attribute is said for a share 1 - 4 MARGIN of each digit's ranks, both for about its square.
    assert abs(len(partial) / len(known.prompts) - (1 - (1 - 4 * MARGIN) ** 2)) < 0.03
    for i in partial[:50]:  # a training caption says only words of the full one, the digit always
        said, full = known.captions[i].split(), known.prompts[i].split()
        assert set(said) < set(full) and said[-1] == full[-1]
    assert digit_captions(margin=0).captions == known.prompts


def test_held_out_triples_cover_every_digit_weight_and_slant():
    held = np.asarray(HELD_OUT)
    assert sorted(held[:, 0]) == list(range(10))
    assert set(held[:, 1]) == {0, 1, 2} and set(held[:, 2]) == {0, 1, 2}
    known = digit_captions()
    assert is_held_out(held[:, 0], held[:, 1], held[:, 2]).all()
    assert known.held_out.sum() == sum(((known.digits == d) & (known.weights == w) & (known.slants == s)).sum()
                                       for d, w, s in HELD_OUT) > 100
    assert set(" ".join(caption(*t) for t in HELD_OUT).split()) <= set(caption_words())
