"""benchmarks/gpu_step_check.py, which gpu_check.sh runs first on a GPU, passes on a CPU with the
late path forced: so the day a GPU runs it, a failure is the GPU's, not the script's."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_step_check.py"


def test_step_check_passes_on_cpu():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DEVICE": "cpu"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "STEP CHECK OK" in out.stdout and "weights equal to step 4's: True" in out.stdout
