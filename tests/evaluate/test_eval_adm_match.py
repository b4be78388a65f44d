"""Inception Score splits and precision/recall distances as the ADM evaluator (guided-diffusion's
evaluations/evaluator.py) computes them, its formulas written out here in numpy; and where the
earlier behaviour (10 equal IS splits, float32 distances) gives other numbers."""

import numpy as np
import pytest
import torch

from dit_trainer.evaluate.inception_score import inception_score
from dit_trainer.evaluate.precision_recall import manifold_radii, pairwise_sq_distances, precision_recall


def _softmax(logits):
    z = np.exp(logits - logits.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def adm_inception_score(logits, split_size=5000):
    """ADM: consecutive parts of split_size (the last one shorter), the mean of exp(mean KL)."""
    preds = _softmax(logits)
    scores = []
    for i in range(0, len(preds), split_size):
        part = preds[i:i + split_size]
        kl = part * (np.log(part) - np.log(np.mean(part, 0, keepdims=True)))
        scores.append(np.exp(np.mean(np.sum(kl, 1))))
    return float(np.mean(scores))


def fidelity_inception_score(logits, splits):
    """torch-fidelity without its shuffle: part i is rows i*N//splits to (i+1)*N//splits."""
    n, p = len(logits), _softmax(logits)
    scores = []
    for i in range(splits):
        part = p[i * n // splits:(i + 1) * n // splits]
        kl = part * (np.log(part) - np.log(part.mean(0, keepdims=True)))
        scores.append(np.exp(kl.sum(1).mean()))
    return float(np.mean(scores)), float(np.std(scores))


def _logits(n, classes=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, classes)) * 3.0


@pytest.mark.parametrize("n", [12_000, 3_000])
def test_inception_score_splits_like_adm_at_any_size(n):
    logits = _logits(n)
    assert inception_score(logits)[0] == pytest.approx(adm_inception_score(logits), rel=1e-12)
    # Ten equal splits (the earlier default) score smaller parts, so a lower IS at these sizes.
    ten = inception_score(logits, splits=10)[0]
    assert ten < adm_inception_score(logits) * (1 - 1e-3)


def test_ten_equal_splits_are_torch_fidelitys_and_agree_with_adm_at_50k():
    odd = _logits(1_007, seed=1)  # 1,007 rows: unequal parts, cut where torch-fidelity cuts them
    assert inception_score(odd, splits=10) == pytest.approx(fidelity_inception_score(odd, 10), rel=1e-12)
    logits = _logits(50_000, classes=10, seed=2)
    assert inception_score(logits, splits=10)[0] == pytest.approx(adm_inception_score(logits), rel=1e-12)


def adm_distances(u, v):
    """ADM's DistanceBlock: float16 squares, norms, product and sums; float32 when a value overflows."""
    u16, v16 = u.astype(np.float16), v.astype(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is what sends a block to float32
        norm_u = np.square(u16).astype(np.float32).sum(1).astype(np.float16)[:, None]
        norm_v = np.square(v16).astype(np.float32).sum(1).astype(np.float16)[None, :]
        product = (u16.astype(np.float32) @ v16.astype(np.float32).T).astype(np.float16)
        d = np.maximum(norm_u - np.float16(2) * product + norm_v, np.float16(0))
    if np.isfinite(d).all():
        return d.astype(np.float32)
    u, v = u.astype(np.float32), v.astype(np.float32)
    d = (u * u).sum(1)[:, None] - 2 * (u @ v.T) + (v * v).sum(1)[None, :]
    return np.maximum(d, 0)


def adm_precision_recall(ref, sam, k=3, block=10_000):
    """ADM's ManifoldEstimator: radii from (row, column) blocks, then one block per (ref, sample) pair."""
    def radii(f):
        rows = [np.concatenate([adm_distances(f[r:r + block], f[c:c + block]) for c in range(0, len(f), block)], 1)
                for r in range(0, len(f), block)]
        return np.concatenate([np.partition(d, k, axis=1)[:, k] for d in rows])

    r_ref, r_sam = radii(ref), radii(sam)
    ref_in, sam_in = np.zeros(len(ref), bool), np.zeros(len(sam), bool)
    for r in range(0, len(ref), block):
        for c in range(0, len(sam), block):
            d = adm_distances(ref[r:r + block], sam[c:c + block])
            ref_in[r:r + block] |= (d <= r_sam[None, c:c + block]).any(1)
            sam_in[c:c + block] |= (d <= r_ref[r:r + block, None]).any(0)
    return float(sam_in.mean()), float(ref_in.mean())


def _integer_features(n, seed, offset=0):
    # Integers: every float32 sum is exact, so the order a matmul adds in cannot matter, while
    # squared norms up to 16·40² exceed 2,048 and float16 rounds them (spacing 2 to 16).
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 41, size=(n, 16)) + offset).astype(np.float32)


def test_float16_distances_are_adms_and_differ_from_float32():
    u, v = _integer_features(50, 0), _integer_features(70, 1)
    ours = pairwise_sq_distances(torch.from_numpy(u), torch.from_numpy(v), dtype="fp16").numpy()
    np.testing.assert_array_equal(ours, adm_distances(u, v))
    exact = ((u[:, None].astype(np.float64) - v[None]) ** 2).sum(-1)
    f32 = pairwise_sq_distances(torch.from_numpy(u), torch.from_numpy(v), dtype="fp32").numpy()
    np.testing.assert_array_equal(f32, exact)  # float32 is exact on these integers; float16 is not
    assert (ours != exact).mean() > 0.5


def test_precision_recall_are_adms_and_float32_counts_ball_edges_differently():
    ref, sam = _integer_features(300, 2), _integer_features(300, 3, offset=1)
    expected = adm_precision_recall(ref, sam)
    assert precision_recall(ref, sam) == expected
    np.testing.assert_array_equal(manifold_radii(ref), np.partition(adm_distances(ref, ref), 3, axis=1)[:, 3])
    assert precision_recall(ref, sam, dtype="fp32") != expected


def test_a_block_that_overflows_float16_falls_back_to_float32_as_in_adm():
    # A far cluster: its squared norms (16·340² ≈ 1.8 M) overflow float16, so blocks holding it are
    # computed in float32 while the others stay in float16; small blocks make both kinds occur.
    ref = np.concatenate([_integer_features(40, 4), _integer_features(20, 5, offset=300)])
    sam = np.concatenate([_integer_features(30, 6, offset=300), _integer_features(50, 7, offset=1)])
    assert precision_recall(ref, sam, batch_size=25) == adm_precision_recall(ref, sam, block=25)
    np.testing.assert_array_equal(manifold_radii(ref, batch_size=25),
                                  np.concatenate([np.partition(np.concatenate(
                                      [adm_distances(ref[r:r + 25], ref[c:c + 25]) for c in range(0, 60, 25)], 1),
                                      3, axis=1)[:, 3] for r in range(0, 60, 25)]))
