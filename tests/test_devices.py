"""enable_tf32: CUDA's float32 matmuls on TF32, consistent for legacy and new readers, CPU untouched."""

import subprocess
import sys

CHECK = """
import torch
from dit_trainer.devices import enable_tf32
before = torch.backends.mkldnn.matmul.fp32_precision
assert not torch.backends.cuda.matmul.allow_tf32
enable_tf32()
# inductor reads the legacy flag, newer code the per-backend one: both must answer, and agree
assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
assert torch.backends.cuda.matmul.fp32_precision == "tf32"
assert torch.get_float32_matmul_precision() == "high"
assert torch.backends.mkldnn.matmul.fp32_precision == before  # CPU matmuls keep full float32
print("ok")
"""


def test_enable_tf32_in_a_fresh_process():
    # A fresh process: the flags are process-global and other tests compare float32 results.
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
