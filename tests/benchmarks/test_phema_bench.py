"""benchmarks/phema.py at a tiny size: it times every part, and the snapshot it measured is the size
its DiT-XL/2 arithmetic assumes (2 bytes per trained parameter and width in fp16, 4 in fp32)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_costs_are_measured_and_the_arithmetic_matches_the_files(tmp_path):
    numbers = tmp_path / "phema.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "phema.py"), "--steps", "1", "--reps", "3",
                          "--snapshots", "2", "--threads", "1", "--json", str(numbers)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(numbers.read_text())
    demo = data["demo"]
    assert all(demo[k] > 0 for k in ("ema_update_s", "phema_update_s", "train_step_off_s", "train_step_on_s"))
    widths = len(data["stds"])
    for dtype, per in (("fp16", 2), ("fp32", 4)):
        snap = demo["snapshots"][dtype]
        tensors = demo["trained"] * widths * per + demo["frozen"] * 4
        assert tensors <= snap["bytes"] < tensors + 64 * 1024  # the header: names, offsets, metadata
        assert snap["write_s"] > 0 and snap["reconstruct_s"] > 0
    assert 6.7e8 < data["dit_xl_2"]["trained"] < 6.8e8
    assert "DiT-XL/2 (arithmetic)" in out.stdout
