"""The per-rank heartbeat, parallel.timeout, and a stalled rank ending the run in one line."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dit_trainer.checkpoint.files import list_checkpoints, step_of, verify_checkpoint
from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.train import heartbeat as hb
from tests.subprocess_env import subprocess_env
from tests.train._stall_worker import Latents
from tests.train.trainer_helpers import tiny_config

WORKER = Path(__file__).with_name("_stall_worker.py")
ENV = subprocess_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


@pytest.mark.parametrize("value", [0, -5, float("nan"), float("inf")])
def test_parallel_timeout_must_be_a_positive_number(value):
    with pytest.raises(ConfigError, match=r"^parallel\.timeout is .*; it must be a positive number of seconds"):
        build_config({"parallel": {"timeout": value}})


def test_parallel_timeout_is_read_as_seconds():
    assert build_config({"parallel": {"timeout": 30}}).parallel.timeout == 30.0


class Ended(Exception):
    """Raised by a patched `end_run`, so a test sees the line instead of the process exiting."""


def _peer(out, rank, **fields):
    rec = {"rank": rank, "step": 7, "step_time": time.time(), "time": time.time(), "state": "running", **fields}
    path = hb.heartbeat_path(out, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


def _recording(beat, stop=False):
    """Record the lines `beat` would end the run with; `stop`: raise Ended as the exit (main thread only)."""
    lines, ended = [], threading.Event()

    def end_run(line):
        lines.append(line)
        ended.set()
        if stop:
            raise Ended(line)

    beat.end_run = end_run
    return lines, ended


def test_a_silent_neighbour_ends_the_run_in_one_line_naming_it_and_the_last_checkpoint(tmp_path):
    (tmp_path / "checkpoints" / "step-00000006").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-00000009.tmp").mkdir()  # half written: not a checkpoint saved
    _peer(tmp_path, 1, step=7)
    beat = hb.Heartbeat(tmp_path, rank=0, world_size=2, timeout=1.0)
    lines, ended = _recording(beat)
    t0 = time.monotonic()
    with beat:
        assert ended.wait(20)
    waited = time.monotonic() - t0
    line = lines[0]
    assert "\n" not in line and waited >= 1.0
    assert "rank 1 stopped responding" in line and "its last step 7" in line and "parallel.timeout 1 s" in line
    assert f"step 6 ({tmp_path / 'checkpoints' / 'step-00000006'})" in line and f"exit code {hb.STALLED_EXIT}" in line


def test_beating_and_finished_neighbours_are_left_alone_and_the_own_file_advances(tmp_path):
    _peer(tmp_path, 2, state="done")  # finished its run earlier: nothing to wait for
    stop = threading.Event()

    def alive():
        while not stop.wait(0.1):
            _peer(tmp_path, 1)

    feeder = threading.Thread(target=alive)
    feeder.start()
    beat = hb.Heartbeat(tmp_path, rank=0, world_size=3, timeout=1.0)
    lines, _ = _recording(beat)
    try:
        with beat:
            first = hb.read_heartbeat(hb.heartbeat_path(tmp_path, 0))
            beat.beat(3)
            time.sleep(2.5)  # more than twice the timeout
            mid = hb.read_heartbeat(hb.heartbeat_path(tmp_path, 0))
    finally:
        stop.set()
        feeder.join()
    assert lines == []
    assert (first["step"], first["state"]) == (0, "running") and first["pid"] == os.getpid()
    assert mid["step"] == 3 and mid["time"] > first["time"] and mid["step_time"] >= first["step_time"]
    assert hb.read_heartbeat(hb.heartbeat_path(tmp_path, 0))["state"] == "done"


def test_a_failed_collective_names_the_rank_furthest_behind_once_the_timeout_passed(tmp_path):
    _peer(tmp_path, 1, step=9)
    _peer(tmp_path, 2, step=8, step_time=time.time() - 40)
    _peer(tmp_path, 3, step=8, state="failed")  # already ended on its own
    beat = hb.Heartbeat(tmp_path, rank=0, world_size=4, timeout=1.0)
    lines, _ = _recording(beat, stop=True)
    beat.beat(9)
    timed_out = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation")
    beat.on_error(timed_out)
    assert lines == []  # this rank has not waited the timeout yet: the error is re-raised as it is
    time.sleep(1.1)
    _peer(tmp_path, 1, step=9)  # still beating
    _peer(tmp_path, 2, step=8, step_time=time.time() - 40)
    beat.on_error(ValueError("a bug of this rank's own"))
    assert lines == []  # not a collective that timed out, and no peer silent or gone: re-raised
    with pytest.raises(Ended):
        beat.on_error(timed_out)
    assert "rank 2 stopped responding (no step for 4" in lines[0] and "its last step 8" in lines[0]
    assert "no checkpoint was saved yet" in lines[0]


def test_a_peer_whose_process_is_gone_is_named_at_once_and_a_timeout_without_culprit_is_one_line(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _peer(tmp_path, 1, step=5, host=socket.gethostname(), pid=gone.pid)
    beat = hb.Heartbeat(tmp_path, rank=0, world_size=2, timeout=60.0)
    lines, _ = _recording(beat, stop=True)
    with pytest.raises(Ended):
        beat.on_error(RuntimeError("Connection closed by peer [127.0.0.1]:1234"))
    assert f"rank 1 stopped responding (its process {gone.pid} on this host is gone, its last step 5" in lines[0]
    # Every peer beating at this rank's step, and a collective that timed out: still one line, no culprit named.
    _peer(tmp_path, 1, step=5, host=socket.gethostname(), pid=os.getpid())
    beat = hb.Heartbeat(tmp_path, rank=0, world_size=2, timeout=0.5)
    lines, _ = _recording(beat, stop=True)
    beat.beat(5)
    time.sleep(0.6)
    with pytest.raises(Ended):
        beat.on_error(RuntimeError("Timed out waiting 500ms for send operation to complete\nmore"))
    assert "\n" not in lines[0] and lines[0].startswith("dit: error: a collective waited parallel.timeout 0.5 s at step 5")
    assert "RuntimeError: Timed out waiting 500ms for send operation to complete)" in lines[0]


def test_ending_the_run_waits_for_a_checkpoint_being_committed(tmp_path):
    """end_run prints its line, marks the rank failed and exits 75, but only once the commit lock is free."""
    script = (
        "import sys, threading, time\n"
        "from dit_trainer.checkpoint.files import COMMIT_LOCK\n"
        "from dit_trainer.train.heartbeat import Heartbeat\n"
        "beat = Heartbeat(sys.argv[1], 0, 2, 5.0)\n"
        "COMMIT_LOCK.acquire()  # a checkpoint being renamed into place and rotated\n"
        "threading.Thread(target=beat.end_run, args=('dit: error: the line',)).start()\n"
        "time.sleep(1.0)\n"
        "print('commit finished', flush=True)\n"
        "COMMIT_LOCK.release()\n"
        "time.sleep(60)\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=ENV, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == hb.STALLED_EXIT, run.stderr[-2000:]
    assert run.stdout == "commit finished\n" and run.stderr == "dit: error: the line\n"
    assert hb.read_heartbeat(hb.heartbeat_path(tmp_path, 0))["state"] == "failed"


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '{"time": "soon", "step_time": 1, "step": 2}', '{"time": 1}'])
def test_a_damaged_heartbeat_reads_as_none(tmp_path, text):
    (tmp_path / "rank00001.json").write_text(text)
    assert hb.read_heartbeat(tmp_path / "rank00001.json") is None
    assert hb.read_heartbeat(tmp_path / "missing.json") is None


def test_heartbeat_advances_during_a_one_process_run(tmp_path):
    from dit_trainer.train import DiTTrainer

    out, seen, stop = tmp_path / "run", [], threading.Event()
    path = hb.heartbeat_path(out, 0)

    def watch():
        while not stop.wait(0.05):
            rec = hb.read_heartbeat(path)
            if rec is not None and (not seen or rec != seen[-1]):
                seen.append(rec)

    cfg = tiny_config(out, parallel={"timeout": 3}, train={"max_steps": 12, "global_batch_size": 4})
    trainer = DiTTrainer(cfg, dataset=Latents(0.05))
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        trainer.train()
    finally:
        stop.set()
        watcher.join()
    running = [r for r in seen if r["state"] == "running"]
    steps = [r["step"] for r in running]
    assert steps == sorted(steps) and len(set(steps)) >= 3, steps  # written while it trained, not only at the end
    assert all(a["time"] < b["time"] for a, b in zip(running, running[1:]))
    final = hb.read_heartbeat(path)
    assert (final["step"], final["state"], final["world_size"], final["pid"]) == (12, "done", 1, os.getpid())
    assert final["interval"] == hb.beat_interval(3.0) and final["step_time"] <= final["time"]
    assert not list(path.parent.glob(".*.tmp"))  # every write was renamed into place


def _alive(pid) -> bool:
    """Whether `pid` runs (a zombie waiting for torchrun to reap it has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _worker_pids(out) -> list:
    pids = []
    for rank in (0, 1):
        try:
            pid = int((out / f"pid-rank{rank}").read_text())
        except (OSError, ValueError):
            continue
        try:  # only a process that is still this test's worker (pids are reused)
            if b"_stall_worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            pass
    return pids


def _wait(condition, proc, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what} ({proc.returncode}):\n{proc.communicate()[1][-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {seconds} s")


@pytest.mark.distributed
@pytest.mark.parametrize("sig, victim", [(signal.SIGSTOP, 0), (signal.SIGKILL, 1)], ids=["sigstop", "sigkill"])
def test_a_stopped_or_dead_rank_ends_the_run_within_the_timeout_in_one_line(tmp_path, sig, victim):
    """2-process FSDP under torchrun: SIGSTOP (SIGKILL) one rank after its second checkpoint; the other exits
    with one line naming it and the newest checkpoint within parallel.timeout + 30 s, and that checkpoint loads."""
    from dit_trainer.train import DiTTrainer

    out, timeout, survivor_rank = tmp_path / "run", 10, 1 - victim
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
           "--out", str(out), "--timeout", str(timeout)]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait(lambda: len(list_checkpoints(out)) >= 2 and len(_worker_pids(out)) == 2, proc, 180, "second checkpoint")
        stopped, survivor = (int((out / f"pid-rank{r}").read_text()) for r in (victim, survivor_rank))
        os.kill(stopped, sig)
        t0 = time.monotonic()
        _wait(lambda: not _alive(survivor), proc, timeout + 60, f"exit of rank {survivor_rank}")
        waited = time.monotonic() - t0
        if _alive(stopped):
            os.kill(stopped, signal.SIGKILL)  # what torchrun's teardown does after its grace period, without the wait
        _, err = proc.communicate(timeout=60)
    finally:
        for pid in _worker_pids(out):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode != 0
    # parallel.timeout reached the process group.
    assert (out / f"timeout-rank{survivor_rank}").read_text() == f"{float(timeout)}"
    assert waited <= timeout + 30, waited
    if sig == signal.SIGKILL:
        assert waited < timeout, waited  # a process gone on this host is named at once
    newest = list_checkpoints(out)[-1]
    lines = [line for line in err.splitlines() if "stopped responding" in line]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"dit: error: rank {victim} stopped responding"), lines
    assert f"rank {survivor_rank} ends the run with exit code {hb.STALLED_EXIT}" in lines[0], lines
    assert f"the last checkpoint saved is step {step_of(newest)} ({newest})" in lines[0], lines
    assert f"exitcode  : {hb.STALLED_EXIT}" in err or f"exitcode: {hb.STALLED_EXIT}" in err, err[-2000:]
    assert hb.read_heartbeat(hb.heartbeat_path(out, survivor_rank))["state"] == "failed"
    # The newest checkpoint is whole and resumes on one process (its DCP shards resharded 2 -> 1).
    for path in list_checkpoints(out):
        verify_checkpoint(path)  # every file as its manifest says
    cfg = tiny_config(tmp_path / "load", parallel={"timeout": timeout},
                      train={"max_steps": 400, "global_batch_size": 4, "seed": 1})
    trainer = DiTTrainer(cfg, dataset=Latents(0.0))
    trainer.load_checkpoint(newest)
    assert trainer.step == step_of(newest)
