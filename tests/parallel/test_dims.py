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


# HSDP's replicate and shard groups, then TP beside FSDP: each with its own timeout, so a group kept from the
# first mesh would show; one launch builds both meshes.
MESHES = [(7.0, {"dp_replicate": 2, "dp_shard": 2}), (9.0, {"dp_shard": 2, "tp": 2})]


@pytest.fixture(scope="module")
def timeouts():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", str(WORKER),
           *[str(a) for timeout, parallel in MESHES for a in (timeout, json.dumps(parallel))]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=subprocess_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("[")][-1])


@pytest.mark.parametrize("mesh", range(len(MESHES)), ids=["hsdp", "fsdp_tp"])
def test_every_mesh_group_waits_parallel_timeout(timeouts, mesh):
    seconds = MESHES[mesh][0]
    assert timeouts[mesh] == dict.fromkeys(("pp", "dp_replicate", "dp_shard", "tp", "dp"), seconds), timeouts[mesh]
