"""ppdiffusers' own DiTPipeline on our export, in the venv scripts/ppdiffusers_env.sh builds.

Skipped unless DIT_PPDIFFUSERS_PYTHON names that venv's python (.ci/run may build it: ~100 s).
"""

import os
import subprocess
import sys

import pytest

PY = os.environ.get("DIT_PPDIFFUSERS_PYTHON")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(not PY, reason="set DIT_PPDIFFUSERS_PYTHON to the python of scripts/ppdiffusers_env.sh's venv")
def test_ppdiffusers_pipeline_loads_our_export(tmp_path, vae_dir):
    script = os.path.join(ROOT, "scripts", "check_ppdiffusers.py")
    common = ["--export", str(tmp_path / "pp"), "--reference", str(tmp_path / "ref.npz")]
    subprocess.run([sys.executable, script, "--make-reference", "--vae", vae_dir, *common], check=True, cwd=ROOT)
    done = subprocess.run([PY, script, *common], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "get_label_ids(['golden retriever']) = [207]" in done.stdout
