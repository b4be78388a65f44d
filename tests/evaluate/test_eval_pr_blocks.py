"""Precision/recall in blocks whose memory does not grow with N: the same values, bit for bit, as
the earlier 10,000 × N row-block implementation, kept here as `old_*`."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from dit_trainer.evaluate.precision_recall import manifold_radii, precision_recall


# --- the implementation before blocks of columns, verbatim but for names ---
def _old_fp32_distances(u, v):
    d = (u * u).sum(1, keepdim=True) - 2.0 * (u @ v.t()) + (v * v).sum(1)[None]
    return d.clamp_min_(0.0)


def _old_fp16_distances(u, v):
    half = torch.float16
    u16, v16 = u.to(half), v.to(half)
    norm_u = (u16 * u16).float().sum(1).to(half)
    norm_v = (v16 * v16).float().sum(1).to(half)
    product = (u16.float() @ v16.float().t()).to(half)
    d = (norm_u[:, None] - 2 * product) + norm_v[None]
    return d.clamp_min_(0)


def old_distances(u, v, dtype):
    if dtype == "fp16":
        d = _old_fp16_distances(u, v)
        if bool(torch.isfinite(d).all()):
            return d.float()
    return _old_fp32_distances(u.float(), v.float())


def old_radii(features, k, batch_size, dtype):
    f = torch.as_tensor(np.asarray(features, dtype=np.float32))
    radii = []
    for start in range(0, len(f), batch_size):
        rows = f[start:start + batch_size]
        d = torch.cat([old_distances(rows, f[c:c + batch_size], dtype) for c in range(0, len(f), batch_size)], 1)
        radii.append(d.kthvalue(k + 1, dim=1).values)
    return torch.cat(radii).numpy()


def old_precision_recall(ref_features, sample_features, k, batch_size, dtype):
    ref = torch.as_tensor(np.asarray(ref_features, dtype=np.float32))
    sam = torch.as_tensor(np.asarray(sample_features, dtype=np.float32))
    ref_radii = torch.as_tensor(old_radii(ref, k, batch_size, dtype))
    sam_radii = torch.as_tensor(old_radii(sam, k, batch_size, dtype))
    ref_in = torch.zeros(len(ref), dtype=torch.bool)
    sam_in = torch.zeros(len(sam), dtype=torch.bool)
    for r in range(0, len(ref), batch_size):
        for c in range(0, len(sam), batch_size):
            d = old_distances(ref[r:r + batch_size], sam[c:c + batch_size], dtype)
            ref_in[r:r + batch_size] |= (d <= sam_radii[None, c:c + batch_size]).any(1)
            sam_in[c:c + batch_size] |= (d <= ref_radii[r:r + batch_size, None]).any(0)
    return float(sam_in.double().mean().item()), float(ref_in.double().mean().item())
# --- end of the earlier implementation ---


def _features(seed, n_ref=173, n_sam=251, dim=24, scale=4.0):
    rng = np.random.default_rng(seed)
    ref = (rng.standard_normal((n_ref, dim)) * scale).astype(np.float32)
    sam = (rng.standard_normal((n_sam, dim)) * scale * 1.3 + 1.0).astype(np.float32)
    return ref, sam


def _same_bits(a, b):
    return np.asarray(a, np.float32).view(np.int32).tobytes() == np.asarray(b, np.float32).view(np.int32).tobytes()


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("batch_size, n_ref, n_sam", [(3, 11, 14), (7, 45, 38), (40, 173, 251), (64, 173, 251),
                                                      (250, 173, 251), (10_000, 173, 251)])
def test_radii_and_precision_recall_are_the_earlier_ones_bit_for_bit(dtype, batch_size, n_ref, n_sam):
    ref, sam = _features(batch_size, n_ref, n_sam, dim=4 if n_ref < 20 else 24)
    for f in (ref, sam):
        assert _same_bits(manifold_radii(f, k=3, batch_size=batch_size, dtype=dtype), old_radii(f, 3, batch_size, dtype))
    got = precision_recall(ref, sam, k=3, batch_size=batch_size, dtype=dtype)
    assert got == old_precision_recall(ref, sam, 3, batch_size, dtype)
    assert 0.0 < got[0] < 1.0 and 0.0 < got[1] < 1.0  # ball edges in play, so a wrong radius would show


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_norms_taken_a_chunk_of_rows_at_a_time_are_the_same_bits(dtype, monkeypatch):
    from dit_trainer.evaluate import precision_recall as pr

    monkeypatch.setattr(pr, "CHUNK", 24 * 5)  # five rows a chunk: 40-row blocks end in a chunk of fewer
    ref, sam = _features(3, n_ref=88, n_sam=81)
    for f in (ref, sam):
        assert _same_bits(manifold_radii(f, batch_size=41, dtype=dtype), old_radii(f, 3, 41, dtype))
    assert precision_recall(ref, sam, batch_size=41, dtype=dtype) == old_precision_recall(ref, sam, 3, 41, dtype)


@pytest.mark.parametrize("batch_size", [30, 64])
def test_blocks_that_overflow_float16_are_recomputed_as_before(batch_size):
    # Norms near float16's 65,504: some blocks overflow and fall back to float32, others do not.
    ref, sam = _features(1, scale=1.0)
    ref[::5] *= 60.0
    sam[::9] *= 60.0
    assert not np.isfinite(_old_fp16_distances(torch.from_numpy(ref), torch.from_numpy(ref)).numpy()).all()
    assert _same_bits(manifold_radii(ref, batch_size=batch_size), old_radii(ref, 3, batch_size, "fp16"))
    assert precision_recall(ref, sam, batch_size=batch_size) == old_precision_recall(ref, sam, 3, batch_size, "fp16")


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_duplicates_nan_and_inf_rank_as_kthvalue_ranks_them(dtype):
    ref, sam = _features(2, n_ref=95, n_sam=131)
    sam[10:20] = sam[0]  # ties and zero distances
    sam[40] = np.nan
    sam[50, 0] = np.inf
    ref[7] = 3e38
    for batch_size in (11, 64):
        for f in (ref, sam):
            assert _same_bits(manifold_radii(f, batch_size=batch_size, dtype=dtype), old_radii(f, 3, batch_size, dtype))
        assert (precision_recall(ref, sam, batch_size=batch_size, dtype=dtype)
                == old_precision_recall(ref, sam, 3, batch_size, dtype))


def test_memory_does_not_grow_with_the_number_of_points():
    # 12,000 points in blocks of 2,000: the earlier rows × N blocks and their concatenation were 192 MB.
    code = """
import json, sys, numpy as np
from dit_trainer.evaluate.precision_recall import manifold_radii
def hwm():
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')) * 1024
f = np.random.default_rng(0).standard_normal((int(sys.argv[1]), 8)).astype(np.float32)
manifold_radii(f[:3000], batch_size=2000, dtype='fp32')  # the workspace and torch's own pools, once
before = hwm()
manifold_radii(f, batch_size=2000, dtype='fp32')
print(json.dumps(hwm() - before))
"""
    grown = [json.loads(subprocess.run([sys.executable, "-c", code, str(n)], capture_output=True, text=True,
                                       check=True).stdout) for n in (4000, 12000)]
    assert grown[1] < grown[0] + 32 * 2**20, grown
    assert grown[1] < 64 * 2**20, grown
