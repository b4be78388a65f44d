"""Data parallel with MindSpore's own launcher on CPU: 2 workers equal 1 process (opt-in: ~45 s).

Run with DIT_MSRUN_TEST=1 scripts/run_mindspore_tests.sh VENV_DIR.
"""

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("DIT_MSRUN_TEST") != "1", reason="set DIT_MSRUN_TEST=1 (about 45 s)")
WORKER = os.path.join(os.path.dirname(__file__), "msrun_worker.py")


def _results(text):
    return re.findall(r"RESULT rank=(\S+) loss=(\S+) sum=(\S+)", text)


def test_two_msrun_workers_equal_one_process(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "latents"
    data.mkdir()
    for i in range(8):
        np.save(data / f"{i}.npy", rng.standard_normal((4, 4, 4)).astype(np.float32))
    np.save(data / "labels.npy", rng.integers(0, 4, 8))
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    single = subprocess.run([sys.executable, WORKER, str(data), str(tmp_path / "one"), "0"], capture_output=True,
                            text=True, timeout=300, env=env)
    assert single.returncode == 0, single.stderr[-2000:]
    [(_, loss1, sum1)] = _results(single.stdout)
    msrun = os.path.join(os.path.dirname(sys.executable), "msrun")
    run = subprocess.run([msrun, "--worker_num=2", "--local_worker_num=2", "--master_port=8129",
                          f"--log_dir={tmp_path / 'logs'}", "--join=True", WORKER, str(data), str(tmp_path / "two"), "0"],
                         capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    logs = "".join(open(f).read() for f in glob.glob(str(tmp_path / "logs" / "worker_*.log")))
    assert run.returncode == 0, logs[-3000:]
    ranks = _results(logs)
    assert sorted(r for r, _, _ in ranks) == ["0", "1"]
    for _, loss, total in ranks:
        assert abs(float(loss) - float(loss1)) < 1e-6 and abs(float(total) - float(sum1)) < 1e-4 * float(sum1)
