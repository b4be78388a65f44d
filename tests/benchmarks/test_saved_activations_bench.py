"""benchmarks/saved_activations.py: the budget reaches the partitioner (a lower budget keeps fewer
bytes and pays in recomputed FLOPs)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--depth", "1", "--hidden-size", "64", "--num-heads", "2", "--batch-size", "2"]


def _table(text):
    lines = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
             if line.startswith("|")]
    return [dict(zip(lines[0], r)) for r in lines[2:]]


def test_lower_budget_keeps_fewer_activations_and_recomputes():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "saved_activations.py"), *TINY,
                          "--input-size", "8", "--dtype", "fp32", "--budgets", "1,0.1", "--list"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["budget"]: r for r in _table(out.stdout)}
    assert set(rows) == {"1", "0.1"}
    full, low = rows["1"], rows["0.1"]
    assert float(full["recomputed FLOPs"].rstrip("%")) == 0.0
    assert float(low["recomputed FLOPs"].rstrip("%")) > 0.0
    assert float(low["MiB per block"]) < float(full["MiB per block"])
    # Every kept tensor is listed with its shape: the block's input x (batch 2, 16 tokens, width 64) among them.
    assert "f32[2,16,64]" in full["kept tensors"]
    assert int(full["tensors kept"]) == len(re.findall(r"\[[\d,]+\]", full["kept tensors"]))
