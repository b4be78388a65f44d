import numpy as np
import pytest

from dit_trainer.evaluate.inception_score import inception_score, inception_score_from_probs
from dit_trainer.evaluate.precision_recall import manifold_radii, precision_recall


def test_inception_score_of_uniform_predictions_is_one():
    mean, std = inception_score(np.zeros((200, 1008)))
    assert mean == pytest.approx(1.0, abs=1e-12) and std == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("classes", [10, 37])
def test_inception_score_of_confident_balanced_predictions_is_class_count(classes):
    labels = np.tile(np.arange(classes), 10 * 3)  # every one of the 10 splits sees each class 3 times
    logits = 1000.0 * np.eye(classes)[labels]  # softmax is exactly one-hot
    mean, std = inception_score(logits, splits=10)
    assert mean == pytest.approx(classes, rel=1e-12) and std == pytest.approx(0.0, abs=1e-9)


def test_inception_score_of_confident_but_one_class_is_one():
    probs = np.zeros((100, 5))
    probs[:, 2] = 1.0
    assert inception_score_from_probs(probs)[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 10 samples"):
        inception_score_from_probs(probs[:5], splits=10)


def _two_clusters(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(300, 16)), rng.normal(size=(200, 16)) + 50.0


def test_precision_recall_of_a_set_against_itself_is_one_and_one():
    a, _ = _two_clusters()
    assert precision_recall(a, a) == (1.0, 1.0)


def test_precision_recall_of_disjoint_clusters_is_zero():
    a, b = _two_clusters()
    assert precision_recall(a, b) == (0.0, 0.0)


def test_precision_recall_sees_a_missing_mode():
    a, b = _two_clusters(1)
    ref = np.concatenate([a, b])  # two modes
    samples = a[::2] + 0.01  # only the first, close to real points
    precision, recall = precision_recall(ref, samples)
    assert precision == 1.0
    assert 0.3 < recall < 0.6 + 1e-9  # the far mode (200 of 500) is not covered


def test_radii_are_kth_neighbour_and_batching_does_not_change_results():
    rng = np.random.default_rng(3)
    f = rng.normal(size=(57, 5)).astype(np.float32)
    d = ((f[:, None] - f[None]) ** 2).sum(-1)
    expected = np.sort(d, axis=1)[:, 3]  # index 0 is the point itself
    np.testing.assert_allclose(manifold_radii(f, k=3, dtype="fp32"), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(manifold_radii(f, k=3, batch_size=8, dtype="fp32"), expected, rtol=1e-4, atol=1e-5)
    # ADM's float16 distances: within float16's rounding of these sizes.
    np.testing.assert_allclose(manifold_radii(f, k=3), expected, rtol=3e-3, atol=3e-2)
    g = rng.normal(size=(41, 5)) + 0.7
    assert precision_recall(f, g, batch_size=6) == precision_recall(f, g)
