"""The process group forms again after torchrun restarts its workers, and a run whose worker is
killed with SIGKILL under `--max-restarts 1` ends bitwise equal to an uninterrupted one."""

import os
import signal
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dit_trainer.parallel.process_group import agree_on_attempt
from dit_trainer.train.metrics import read_metrics
from tests.parallel._agents import Agents, digits_config, free_port, wait_for, worker_pid
from tests.parallel._common import final_weights


def _round(port, world_size, stale_ranks=()):
    """Every rank's attempt number in one round of `world_size` ranks (threads, each with its own client of the
    store on `port`, as processes have); `stale_ranks` start late."""
    got = {}

    def rank(r):
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        got[r] = agree_on_attempt(store, r, world_size, timedelta(seconds=30))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    # Late ranks start after rank 0 has drawn its number: they must not take an earlier round's.
    order = [t for r, t in enumerate(threads) if r not in stale_ranks] + [threads[r] for r in stale_ranks]
    for t in order:
        t.start()
    for t in threads:
        t.join(60)
    return got


def test_every_round_agrees_on_a_new_attempt():
    """Ranks of one round get one number, each round a new one, also with tokens of earlier rounds in the store."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))  # noqa: F841 (serves)
    first = _round(port, 3)
    second = _round(port, 3, stale_ranks=(1, 2))
    third = _round(port, 2, stale_ranks=(1,))  # a smaller world: a node lost
    assert set(first.values()) == {1} and sorted(first) == [0, 1, 2]
    assert set(second.values()) == {2} and sorted(second) == [0, 1, 2]
    assert set(third.values()) == {3} and sorted(third) == [0, 1]


def _losses(out):
    return {r["step"]: (r["loss"], r.get("grad_norm")) for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


@pytest.mark.distributed
def test_killed_worker_restarts_and_ends_bitwise_equal(tmp_path):
    """torchrun --max-restarts 1 with c10d rendezvous (FSDP over 2 workers): rank 0 killed with SIGKILL after the
    first checkpoint; both restart, resume the newest checkpoint without a flag, and the losses, weights and EMA
    equal an uninterrupted launch's bit for bit; metrics.jsonl records the restart."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = ["-m", "dit_trainer", "train", "--parallel.dp_shard", "2"]
    with Agents(tmp_path) as agents:
        agents.start(*args, "--config", digits_config(tmp_path / "a.yaml", straight), nproc=2)
        victim = agents.start(*args, "--config", digits_config(tmp_path / "b.yaml", killed), nproc=2, max_restarts=1)
        wait_for(killed / "checkpoints" / "step-00000010", victim)
        os.kill(worker_pid(victim, rank=0), signal.SIGKILL)  # the rank that holds the lock and writes metrics
        assert agents.wait() == [0, 0], agents.logs()
    events = [r for r in read_metrics(killed / "metrics.jsonl") if r.get("event") == "resumed"]
    assert len(events) == 1, f"want one resume record, got {events}"
    resumed = events[0]
    assert resumed["restart"] == 1 and resumed["world_size"] == 2, resumed
    assert resumed["checkpoint"] == f"step-{resumed['step']:08d}" and 10 <= resumed["step"] < 40, resumed
    assert not [r for r in read_metrics(straight / "metrics.jsonl") if "event" in r]
    ref, got = _losses(straight), _losses(killed)
    assert sorted(got) == sorted(ref) == list(range(5, 41, 5))
    assert got == ref, "losses or grad norms differ from the uninterrupted run"
    for a, b, what in zip(final_weights(straight, 40), final_weights(killed, 40), ("model", "ema")):
        assert sorted(a) == sorted(b)
        for k in a:
            assert torch.equal(a[k], b[k]), f"{what} {k} differs from the uninterrupted run"
