"""benchmarks/dataloader.py: a bad --dir is a one-line error, not a traceback."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_missing_scratch_dir_is_one_line(tmp_path):
    missing = tmp_path / "missing"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dataloader.py"), "--dir", str(missing)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (f"dataloader.py: error: cannot make a scratch folder in --dir {missing} "
                                   "(No such file or directory); pass an existing, writable folder or leave --dir out")
