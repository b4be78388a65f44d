"""torchrun agents as the tests' "nodes": each `torchrun` in its own session on a free port of localhost,
killed with its whole process group when the test ends (pass or fail), so no orphan survives."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.subprocess_env import subprocess_env


def free_port() -> int:
    """A TCP port of localhost no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def digits_config(path, out, **sections) -> Path:
    """A YAML config at `path` for a DiT-S/2 of 2 blocks on the 8x8 digits (SiT objective), global batch 16,
    EMA 0.9, a checkpoint every 10 steps; `sections` update it ({"train": {"max_steps": 30}})."""
    cfg = {
        "output_dir": str(out),
        "objective": "transport",
        "model": {"name": "DiT-S/2", "input_size": 8, "in_channels": 1, "num_classes": 10, "depth": 2,
                  "hidden_size": 32, "num_heads": 2, "learn_sigma": False},
        "data": {"path": "digits", "digits_size": 8, "num_workers": 0, "random_flip": False},
        "optim": {"lr": 1e-3, "max_grad_norm": 1e6},
        "train": {"max_steps": 40, "global_batch_size": 16, "seed": 0, "mixed_precision": "fp32", "device": "cpu",
                  "ema_decay": 0.9},
        "checkpoint": {"save_steps": 10, "save_total_limit": 0},
        "logging": {"log_steps": 5, "tensorboard": False, "progress": False},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    Path(path).write_text(yaml.safe_dump(cfg))
    return Path(path)


class Agents:
    """Context manager: start torchrun agents (`start`), wait for them, and kill every one still running at exit."""

    def __init__(self, log_dir):
        self.log_dir = Path(log_dir)
        self.procs = []

    def start(self, *args, nnodes="1", node_rank=0, nproc=1, port=None, max_restarts=0, rdzv="c10d", env=None):
        """One `torchrun --nnodes N --node-rank R --nproc_per_node P` on rendezvous 127.0.0.1:`port` (c10d)
        running `args` (`-m dit_trainer train ...` or a script); returns its Popen."""
        port = port or free_port()
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={node_rank}",
               f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}", "--monitor-interval=0.2"]
        if rdzv == "c10d":
            # The endpoint is node 0's, as on real hosts, where only node 0's address matches it (here every
            # agent's does, and whichever bound the port first would host the rendezvous). A lost node is
            # dropped after 5 missed 1-s heartbeats (torch's default: 3 missed 5-s ones).
            conf = ("join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5,"
                    f"is_host={int(node_rank == 0)}")
            cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=test", f"--rdzv-conf={conf}"]
        else:
            cmd += ["--master-addr=127.0.0.1", f"--master-port={port}"]
        cmd += [str(a) for a in args]
        log = open(self.log_dir / f"agent{len(self.procs)}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=subprocess_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {})))
        proc.log_path = log.name
        self.procs.append(proc)
        return proc

    def wait(self, timeout=240) -> list:
        """Every agent's exit code (waiting at most `timeout` seconds for all of them)."""
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"torchrun agents still running after {timeout} s:\n{self.logs()}") from None
        return codes

    def logs(self, tail=4000) -> str:
        """The tail of every agent's log."""
        return "\n".join(f"--- {p.log_path}\n{Path(p.log_path).read_text(errors='replace')[-tail:]}"
                         for p in self.procs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            if proc.poll() is None:
                kill_node(proc)
        return False


def kill_node(agent) -> None:
    """SIGKILL a torchrun agent and its workers, as a lost node: torchrun starts each worker in a session of
    its own, so the agent's process group alone would leave them running."""
    try:
        os.kill(agent.pid, signal.SIGSTOP)  # it starts no worker while its tree is read
    except ProcessLookupError:
        return
    for pid in _descendants(agent.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(agent.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    agent.wait()


def worker_pid(agent, rank: int, timeout=60.0) -> int:
    """The pid of the worker of torchrun `agent` that runs global rank `rank` (read from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in _children(agent.pid):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in env:
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no worker of rank {rank} under torchrun pid {agent.pid}")


def _children(pid: int) -> list:
    return [child for child, parent in _parents().items() if parent == pid]


def _parents() -> dict:
    """pid -> parent pid of every process (from /proc)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            out[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def _descendants(pid: int) -> list:
    parents = _parents()
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, parent in parents.items() if parent == p]
        found += kids
        todo += kids
    return found


def wait_for(path, proc=None, timeout=120.0) -> None:
    """Poll until `path` exists (failing early when `proc` has exited)."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"torchrun exited {proc.returncode} before {path} appeared")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.01)
