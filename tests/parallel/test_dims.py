"""`parallel.timeout` reaches every group of the device mesh, not only the default group: torch makes
the mesh's groups with its own default (30 min on gloo), so a rank stuck in an HSDP or TP collective
would otherwise outwait the setting."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocess_env import subprocess_env

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("_timeout_worker.py")


@pytest.mark.parametrize("parallel", [{"dp_replicate": 2, "dp_shard": 2}, {"dp_shard": 2, "tp": 2}])
def test_every_mesh_group_waits_parallel_timeout(parallel):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", str(WORKER),
           "7", json.dumps(parallel)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=subprocess_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    seconds = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert seconds == {"pp": 7.0, "dp_replicate": 7.0, "dp_shard": 7.0, "tp": 7.0, "dp": 7.0}, seconds
