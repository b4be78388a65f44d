"""Two torchrun agents on one c10d rendezvous, as two nodes would run: DDP, FSDP and HSDP (replicate across
the agents, shard within each) train to the single-process losses and weights, and the sharded
checkpoint both agents wrote resumes on one process."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from dit_trainer.train.metrics import read_metrics
from tests.parallel._agents import Agents, digits_config, free_port, kill_node, wait_for
from tests.parallel._common import STEPS, deterministic, final_weights, read_losses, train_one_process

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).parent / "_agents_worker.py"
LAYOUTS = ("ddp", "fsdp", "hsdp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("agents")
    with deterministic():
        train_one_process(out / "reference")
    port = free_port()
    with Agents(out) as agents:
        for node in (0, 1):  # 2 workers each: 4 ranks
            agents.start(WORKER, "--out", out, "--layouts", ",".join(LAYOUTS), nnodes="2", node_rank=node, nproc=2,
                         port=port)
        assert agents.wait() == [0, 0], agents.logs()
    resumed = out / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "fsdp" / "checkpoints" / "step-00000005", resumed / "checkpoints" / "step-00000005")
    with deterministic():
        train_one_process(resumed)  # 4 ranks' DCP shards, from two agents, loaded by one process
    return out


def _close(got: dict, ref: dict, steps):
    assert sorted(got) == list(steps)
    for s in steps:
        assert abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]), f"step {s}: {got[s]} vs single-process {ref[s]}"


def test_ranks_ran_on_two_agents(runs):
    where = [json.loads((runs / f"rank{r}.json").read_text()) for r in range(4)]
    assert {w["WORLD_SIZE"] for w in where} == {4}
    assert sorted((w["GROUP_RANK"], w["LOCAL_RANK"]) for w in where) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_agents_match_one_process(runs, layout):
    ref = runs / "reference"
    for key in ("loss", "grad_norm"):
        _close(read_losses(runs / layout, key), read_losses(ref, key), range(1, STEPS + 1))
    for what, got, want in zip(("model", "ema"), final_weights(runs / layout), final_weights(ref)):
        assert sorted(got) == sorted(want)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{what} {k}: {m}")


def test_checkpoint_of_two_agents_resumes_on_one_process(runs):
    assert (runs / "fsdp" / "checkpoints" / "step-00000005" / "dcp").is_dir()
    _close(read_losses(runs / "resumed"), read_losses(runs / "reference"), range(6, STEPS + 1))


def _lose_a_node(tmp_path, *flags):
    """Train the digits on `--nnodes 1:2 --max-restarts 1` with two agents, kill the second agent and its worker
    after the first checkpoint (a lost node); returns (the first agent's exit code, its log, the run folder)."""
    out = tmp_path / "run"
    config = digits_config(tmp_path / "c.yaml", out)
    port = free_port()
    with Agents(tmp_path) as agents:
        nodes = [agents.start("-m", "dit_trainer", "train", "--config", config, *flags, nnodes="1:2", node_rank=n,
                              port=port, max_restarts=1) for n in (0, 1)]
        wait_for(out / "checkpoints" / "step-00000010", nodes[0])
        kill_node(nodes[1])
        code = nodes[0].wait(timeout=240)
        return code, Path(nodes[0].log_path).read_text(errors="replace"), out


def test_lost_node_goes_on_with_the_smaller_world(tmp_path):
    """dp_shard -1 (the default): the surviving agent restarts alone and finishes from the checkpoint."""
    code, log, out = _lose_a_node(tmp_path)
    assert code == 0, log[-4000:]
    records = read_metrics(out / "metrics.jsonl")
    events = [r for r in records if "event" in r]
    assert len(events) == 1 and events[0]["world_size"] == 1 and events[0]["restart"] == 1, events
    assert 10 <= events[0]["step"] < 40 and events[0]["checkpoint"] == f"step-{events[0]['step']:08d}"
    assert [r["step"] for r in records if "loss" in r] == list(range(5, 41, 5))
    assert (out / "checkpoints" / "step-00000040").is_dir()


def test_lost_node_with_fixed_degrees_stops_in_one_line(tmp_path):
    """--parallel.dp_shard 2 fits no world of 1: the restarted rank says so in one line and the launch ends."""
    code, log, out = _lose_a_node(tmp_path, "--parallel.dp_shard", "2")
    assert code != 0
    lines = [line for line in log.splitlines() if "dit train: error:" in line]
    assert len(lines) == 1 and "do not multiply to the world size 1" in lines[0], log[-4000:]
    assert (out / "checkpoints" / "step-00000010").is_dir()
