"""benchmarks/eval_memory.py's parts at a tiny size: the samples it writes are what dit eval reads, and
a measured child reports its exit code, wall time, peak RSS and metrics."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("sklearn")

import eval_memory  # noqa: E402

from dit_trainer.evaluate.npz import NpzImages  # noqa: E402


def test_samples_are_64px_digits_that_dit_eval_reads(tmp_path):
    eval_memory.write_samples(tmp_path / "s.npz", 23, chunk=10)
    images = NpzImages(tmp_path / "s.npz")
    assert images.shape == (23, 64, 64)
    batch = np.concatenate(list(images.batches(8)))
    assert batch.shape == (23, 64, 64, 3) and batch.std() > 10
    assert len({b.tobytes() for b in batch}) == 23  # noise makes every image its own


def test_a_measured_run_reports_its_peak_and_metrics(tmp_path):
    eval_memory.write_samples(tmp_path / "s.npz", 30)
    r = eval_memory.measure(ROOT / "src", tmp_path / "s.npz", tmp_path / "m.json", 16 * 2**30, 300)
    assert r["rc"] == 0, r["stderr"][-5:]
    assert r["peak_mib"] > 50 and r["wall"] > 0
    assert r["metrics"]["num_samples"] == 30 and 0 <= r["metrics"]["precision"] <= 1
    wall, peak = eval_memory.outcome(r, 16)
    assert wall.endswith(" s") and peak.endswith(" GiB")
    failed = dict(r, rc=1, stderr=["RuntimeError: DefaultCPUAllocator: can't allocate memory"])
    assert "out of memory under the 16 GiB cap" in eval_memory.outcome(failed, 16)[1]
