"""`dit sample-ddp` over two torchrun agents (two "nodes" on one c10d rendezvous): one .npz equal to
a one-process run, also when one agent is killed mid-way and the launch is run again."""

import time

import numpy as np
import pytest

from dit_trainer.checkpoint import save_checkpoint
from dit_trainer.cli import main
from tests.parallel._agents import Agents, free_port, kill_node
from tests.sample.test_sample_ddp import _files

pytestmark = pytest.mark.distributed

# 16 chunks of 2: each agent's worker samples 8, so a kill after the first lands mid-way.
ARGS = ["--num-samples", "32", "--batch-size", "2", "--sampler", "ode", "--ode-method", "euler", "--steps", "8",
        "--seed", "7", "--device", "cpu", "--no-progress"]


def _launch(agents, ckpt, npz):
    port = free_port()
    return [agents.start("-m", "dit_trainer", "sample-ddp", "--ckpt", ckpt, "--npz", npz, *ARGS, nnodes="2",
                         node_rank=node, port=port) for node in (0, 1)]


def test_two_agents_write_one_process_batch_and_resume_after_one_is_killed(tmp_path):
    ckpt = save_checkpoint(tmp_path / "run", 1, _files())
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(one), *ARGS]) == 0
    parts = tmp_path / "two.npz.parts"
    with Agents(tmp_path) as agents:
        first = _launch(agents, ckpt, two)
        deadline = time.monotonic() + 120
        while not list(parts.glob("chunk-*.npz")):
            assert time.monotonic() < deadline and first[0].poll() is None, agents.logs()
            time.sleep(0.01)
        kill_node(first[1])  # the second "node" is gone: its agent and its worker
        assert first[0].wait(timeout=180) != 0, agents.logs()
    kept = sorted(parts.glob("chunk-*.npz"))
    assert 0 < len(kept) < 16 and not two.exists()
    # Mark one kept chunk (its evaluation count, not its images): the finished batch shows it was reused.
    with np.load(kept[0]) as f:
        chunk = dict(f)
    with open(kept[0], "wb") as f:
        np.savez(f, **{**chunk, "nfe": np.float64(chunk["nfe"] + 32)})
    (tmp_path / "again").mkdir()
    with Agents(tmp_path / "again") as agents:
        _launch(agents, ckpt, two)
        assert agents.wait() == [0, 0], agents.logs()
    a, b = np.load(one), np.load(two)
    assert np.array_equal(a["arr_0"], b["arr_0"]) and np.array_equal(a["arr_1"], b["arr_1"])
    assert float(b["nfe"]) == pytest.approx(float(a["nfe"]) + 2), "the kept chunk was sampled again"
    assert not parts.exists()
