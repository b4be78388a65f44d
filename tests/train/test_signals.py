"""SIGTERM/SIGINT finish the step, save and exit 0; the rerun ends equal to an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dit_trainer.checkpoint import list_checkpoints
from tests.subprocess_env import subprocess_env

WORKER = Path(__file__).with_name("_signal_worker.py")
ENV = subprocess_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")  # the worker imports tests.train


def _wait_for_step(out, step, proc, timeout=120):
    """Block until metrics.jsonl shows `step` (the run is mid-way), failing if the run ends first."""
    end = time.time() + timeout
    metrics = Path(out) / "metrics.jsonl"
    while time.time() < end:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early ({proc.returncode}):\n{proc.communicate()[1][-3000:]}")
        if metrics.exists():
            steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.endswith("}")]
            if steps and steps[-1] >= step:
                return
        time.sleep(0.05)
    raise AssertionError("run did not reach step {step}")


def _final(out, step=8):
    ck = Path(out) / "checkpoints" / f"step-{step:08d}"
    return load_file(str(ck / "ema.safetensors"))


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _signal_mid_run(tmp_path, sig, reference=True):
    """Start the slow run, signal it after step 1; returns (out, ref, step it stopped at)."""
    out, ref = tmp_path / "run", tmp_path / "ref"
    extra = ["--reference", str(ref)] if reference else []
    proc = subprocess.Popen([sys.executable, str(WORKER), "--out", str(out), "--slow", *extra],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(out, 1, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    saved = [p.name for p in list_checkpoints(out)]
    stopped = int((out / "done-rank0").read_text())
    assert 1 <= stopped < 8 and saved[-1] == f"step-{stopped:08d}", (saved, stopped)
    assert f"{signal.Signals(sig).name} received" in err
    return out, ref, stopped


def test_sigint_saves_and_exits_0(tmp_path):
    _signal_mid_run(tmp_path, signal.SIGINT, reference=False)


def test_sigterm_saves_and_rerun_ends_equal(tmp_path):
    out, ref, _ = _signal_mid_run(tmp_path, signal.SIGTERM)
    rerun = subprocess.run([sys.executable, str(WORKER), "--out", str(out)], env=ENV, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _same(_final(ref), _final(out))
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))


def test_second_sigint_stops_at_once(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(WORKER), "--out", str(out), "--slow"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(out, 1, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    # Out without finishing the run or saving a checkpoint for the step it was in (saves come every 4 steps).
    assert proc.returncode == 130 and time.time() - t0 < 30
    assert not (out / "done-rank0").exists()
    assert all(int(p.name[5:]) % 4 == 0 for p in list_checkpoints(out))


@pytest.mark.distributed
def test_sigterm_to_one_rank_stops_all_under_torchrun(tmp_path):
    """2-process FSDP: SIGTERM to rank 1 only; both ranks stop at the same step, save and exit 0."""
    out, ref = tmp_path / "run", tmp_path / "ref"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER)]
    proc = subprocess.Popen(cmd + ["--out", str(out), "--slow", "--reference", str(ref)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(out, 1, proc, timeout=240)
    os.kill(int((out / "pid-rank1").read_text()), signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    stopped = {int((out / f"done-rank{r}").read_text()) for r in (0, 1)}
    assert len(stopped) == 1 and 1 <= min(stopped) < 8, stopped
    assert (out / "checkpoints" / f"step-{min(stopped):08d}" / "dcp" / ".metadata").is_file()
    rerun = subprocess.run(cmd + ["--out", str(out)], env=ENV, capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _same(_final(ref), _final(out))
