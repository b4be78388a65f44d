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
            "--warmup", "1", "--steps", "2", "--peak-reps", "1", "--peak-sizes", "1024", "--threads", "1",
            "--device", "cpu"]
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


def test_routed_variant_counts_the_flops_its_blocks_compute(monkeypatch):
    import argparse
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    for name in ("_common", "train_step"):  # the script's own `_common`, whatever a test folder named so
        monkeypatch.delitem(sys.modules, name, raising=False)
    bench = importlib.import_module("train_step")
    args = argparse.Namespace(model="DiT-S/2", input_size=8, in_channels=4, num_classes=10, depth=6, hidden_size=64,
                              num_heads=2, model_option=None, batch_size=2, device="cpu")
    routed = bench.parse_variant("bf16+compile+route0.5")
    assert (routed["route"], routed["compile"], routed["precision"]) == (0.5, True, "bf16")
    assert bench.make_config(args, routed)["train"]["routing_keep"] == 0.5
    # Blocks 2 and 3 of 6 on 8 of the 16 tokens: the share lies strictly between a half and one.
    assert 0.5 < bench.computed_share(args, routed) < 1 == bench.computed_share(args, bench.parse_variant("bf16"))
