"""examples/slurm_train.sbatch and examples/two_hosts.sh train for real on this machine: stand-in `srun`
and `scontrol` (first on PATH) play a 2-node allocation, and a stand-in `torchrun` records each
command line and runs the real one (`python -m torch.distributed.run`), one process per "node",
meeting over c10d on localhost. A typo in a script's flags fails here, not in a user's job."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.subprocess_env import subprocess_env

pytestmark = pytest.mark.distributed

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STEPS = 2
CONFIG = {
    "model": {"name": "DiT-S/4", "input_size": 8, "in_channels": 1, "num_classes": 10, "depth": 1,
              "hidden_size": 32, "num_heads": 2},
    "data": {"path": "digits", "digits_size": 8, "num_workers": 0},
    "train": {"max_steps": STEPS, "global_batch_size": 4, "mixed_precision": "fp32", "device": "cpu"},
    "checkpoint": {"save_steps": 1000},
    "logging": {"log_steps": 1, "tensorboard": False, "progress": False},
}

# Records its arguments (one JSON list a line), then runs the real torchrun with them.
TORCHRUN = """#!{python}
import json, os, sys
with open(os.environ["LAUNCH_LOG"], "a") as f:
    f.write(json.dumps(["torchrun", *sys.argv[1:]]) + "\\n")
os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *sys.argv[1:]])
"""

# SLURM's srun for one task per node: the options the script may pass, then the command, run once per
# node of the allocation at once with that node's SLURM_NODEID; --kill-on-bad-exit ends the others
# when one fails. Any other option is refused, as an unknown option would be by SLURM.
SRUN = """#!{python}
import json, os, subprocess, sys, time
args = sys.argv[1:]
with open(os.environ["LAUNCH_LOG"], "a") as f:
    f.write(json.dumps(["srun", *args]) + "\\n")
opts = {{}}
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag == "--kill-on-bad-exit=1":
        opts["kill"] = True
    elif flag in ("--nodes", "--ntasks-per-node"):
        opts[flag] = args.pop(0)
    else:
        sys.exit(f"srun: unrecognized option '{{flag}}'")
nodes = int(opts.get("--nodes", os.environ["SLURM_JOB_NUM_NODES"]))
if opts.get("--ntasks-per-node", "1") != "1" or nodes != int(os.environ["SLURM_JOB_NUM_NODES"]):
    sys.exit(f"srun: this stand-in runs one task on each of the job's nodes, not {{opts}}")
procs = [subprocess.Popen(args, env={{**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i),
                                      "SLURM_LOCALID": "0"}}) for i in range(nodes)]
while any(p.poll() is None for p in procs):
    if opts.get("kill") and any(p.returncode not in (None, 0) for p in procs):
        for p in procs:
            if p.poll() is None:
                p.terminate()
    time.sleep(0.2)
sys.exit(max(p.returncode for p in procs))
"""

# `scontrol show hostnames LIST` of the job's node list: this machine first, a made-up second node after it.
SCONTROL = """#!{python}
import os, sys
if sys.argv[1:] != ["show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]:
    sys.exit(f"scontrol: this stand-in answers `show hostnames $SLURM_JOB_NODELIST` only, not {{sys.argv[1:]}}")
print("localhost")
print("node-2")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stand_ins(tmp_path):
    """(PATH with the stand-ins first, the launch log, the config file)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("torchrun", TORCHRUN), ("srun", SRUN), ("scontrol", SCONTROL)):
        path = bin_dir / name
        path.write_text(text.format(python=sys.executable))
        path.chmod(0o755)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", tmp_path / "launch.log", config


def _env(path, log, **extra):
    # One process per node on a CPU; no restarts, so a failing worker fails the test at once.
    return subprocess_env(PATH=path, LAUNCH_LOG=str(log), PROCS_PER_NODE="1", MAX_RESTARTS="0",
                          OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)


def _log(log) -> list:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _torchrun_line(port, run_id, out, config, node_rank=None):
    rank = [] if node_rank is None else ["--node-rank", str(node_rank)]
    return ["torchrun", "--nnodes", "2", *rank, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{'localhost' if node_rank is None else '127.0.0.1'}:{port}", "--rdzv-id", run_id,
            "--max-restarts", "0", "-m", "dit_trainer", "train", "--config", str(config), "--output_dir", str(out)]


def _trained_on_two_ranks(out):
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert steps == list(range(1, STEPS + 1))
    # dp_shard -1 sharded the model over the world the two nodes made: one shard file per rank.
    shards = sorted(p.name for p in (out / "checkpoints" / f"step-{STEPS:08d}" / "dcp").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]


def test_slurm_script_runs_one_torchrun_per_node(stand_ins, tmp_path):
    path, log, config = stand_ins
    port, out = _free_port(), tmp_path / "run"
    env = _env(path, log, SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="node-[1-2]", SLURM_JOB_ID="4242",
               RDZV_PORT=str(port))
    done = subprocess.run(["bash", str(EXAMPLES / "slurm_train.sbatch"), "--config", str(config), "--output_dir",
                           str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    calls = _log(log)
    assert calls[0] == ["srun", "--nodes", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1", *calls[1]]
    assert calls[1:] == [_torchrun_line(port, "dit-4242", out, config)] * 2
    _trained_on_two_ranks(out)


def test_two_hosts_recipe_runs_on_each_host(stand_ins, tmp_path):
    path, log, config = stand_ins
    port, out = _free_port(), tmp_path / "run"
    env = _env(path, log, RDZV_PORT=str(port), RUN_ID="test-run")
    script = ["bash", str(EXAMPLES / "two_hosts.sh"), "127.0.0.1"]
    rest = ["--config", str(config), "--output_dir", str(out)]
    hosts = [subprocess.Popen([*script, str(rank), *rest], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in (0, 1)]
    outputs = [h.communicate(timeout=300)[0] for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert sorted(_log(log)) == [_torchrun_line(port, "test-run", out, config, rank) for rank in (0, 1)]
    _trained_on_two_ranks(out)


def test_two_hosts_recipe_refuses_a_bad_rank(stand_ins):
    path, log, _ = stand_ins
    done = subprocess.run(["bash", str(EXAMPLES / "two_hosts.sh"), "host-a", "2"], env=_env(path, log),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage:" in done.stderr and "NODE_RANK(0|1)" in done.stderr
    assert not log.exists()  # torchrun never started
