"""benchmarks/train_step.py at a tiny size: the trainer and the baseline loop step, and the speed,
MFU and memory it reports for them are possible numbers."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reports_speed_mfu_and_memory_per_variant(tmp_path):
    numbers = tmp_path / "train_step.json"
    tiny = ["--depth", "1", "--hidden-size", "64", "--num-heads", "2", "--input-size", "8", "--batch-size", "2",
            "--warmup", "1", "--steps", "2", "--peak-reps", "1", "--threads", "1", "--device", "cpu"]
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_step.py"), *tiny,
                          "--variants", "orig-fp32,fp32", "--json", str(numbers)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(numbers.read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert set(rows) == {"orig-fp32", "fp32"}
    # The trainer and the baseline loop train the same network, counted once for both.
    assert rows["fp32"]["params"] == rows["orig-fp32"]["params"] > 0 and data["flops_per_image"] > 0
    for row in rows.values():
        assert row["compute"] == "fp32" and row["img_per_s"] > 0
        # Above 100% of the measured matmul peak, the FLOP count or the timing would be wrong.
        assert 0 < row["mfu"] < 1
        # Each variant's fresh process holds more at its peak than after its imports.
        assert row["peak_mib"] > row["base_mib"] > 0
