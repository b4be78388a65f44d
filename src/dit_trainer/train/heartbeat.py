"""Per-rank heartbeat files in the run folder, and the watchdog that ends a run whose peer stopped.

Every rank keeps `output_dir/heartbeat/rankNNNNN.json` (see `record`), rewritten atomically by a
background thread every `beat_interval(parallel.timeout)` seconds whatever a step costs: a step of
microseconds writes no more than a step of minutes, and the time in the file says the process is
alive even while one step (a first compiled one, a checkpoint save) takes long. The training loop
only records its step in memory (`Heartbeat.beat`).

The same thread watches its two neighbours' files (ranks r-1 and r+1): two reads per beat however
many ranks the run has, and every rank is watched by two others. A peer whose file has not changed
for `parallel.timeout` seconds is frozen or gone (SIGSTOP, a dead host, a swapped-out node): the
watcher prints one line naming it and the last checkpoint saved, and exits with `STALLED_EXIT`
instead of waiting inside a collective for ever. A collective that fails (a peer alive but not
stepping makes it time out after `parallel.timeout`, the process group's timeout; a dead peer's
connection closes at once) goes to `Heartbeat.on_error`, which ends the run with the same line
when it finds the peer: its process on this host gone, its heartbeat silent, or its step behind.
gloo's all_reduce, barrier and all_gather (FSDP's) all raise a RuntimeError after the timeout and
release the GIL while they wait, so this thread keeps beating and watching meanwhile.
"""

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

HEARTBEAT_DIR = "heartbeat"
# EX_TEMPFAIL (sysexits.h): a temporary failure; rerunning the same command resumes the run.
STALLED_EXIT = 75
# How long a forced exit waits for a checkpoint being renamed into place (and rotated) to finish.
COMMIT_WAIT_S = 300.0
# How long an error of the loop waits for a verdict on its peers before it is raised as it is.
VERDICT_WAIT_S = 1.0


def beat_interval(timeout: float) -> float:
    """Seconds between two writes of a rank's heartbeat: a tenth of the timeout, from 0.5 s to 10 s."""
    return min(10.0, max(0.5, timeout / 10.0))


def heartbeat_path(output_dir, rank: int) -> Path:
    """Where rank `rank` of the run in `output_dir` writes its heartbeat."""
    return Path(output_dir) / HEARTBEAT_DIR / f"rank{rank:05d}.json"


def read_heartbeat(path):
    """A heartbeat file's record, or None when it is missing, unreadable or not one."""
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        # The numbers the watchdog computes with, checked once here.
        float(rec["time"]), float(rec["step_time"]), int(rec["step"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return rec


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s"


def _pid_alive(pid) -> bool:
    """Whether process `pid` of this host runs (a zombie its launcher has not reaped yet has ended)."""
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError):
        return True  # no pid recorded: nothing to tell
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): it exists


class Heartbeat:
    """Writes this rank's heartbeat and watches its neighbours' while a run trains (a context manager)."""

    def __init__(self, output_dir, rank: int, world_size: int, timeout: float, step: int = 0):
        self.output_dir, self.rank, self.world_size, self.timeout = Path(output_dir), rank, world_size, float(timeout)
        self.interval = beat_interval(self.timeout)
        self.step, self.step_time = int(step), time.time()
        self._stepped = time.monotonic()  # when this rank last finished a step (or started)
        self.peers = sorted({(rank - 1) % world_size, (rank + 1) % world_size} - {rank})
        self._seen = {}  # peer -> (its last record's write time, when that changed here, monotonic)
        self._done = threading.Event()
        self._ending, self._writing, self._sealed = threading.Lock(), threading.Lock(), False
        self._thread = None

    def beat(self, step: int) -> None:
        """Record that this rank finished `step` (no I/O: the thread writes it)."""
        self.step, self.step_time, self._stepped = int(step), time.time(), time.monotonic()

    def record(self, state: str = "running") -> dict:
        """What the file holds: rank, world size, last finished step and its wall time (`step_time`),
        the write's wall time (`time`), the seconds between writes, the timeout, pid, host and state
        (`running`, `done`, `failed`)."""
        return {"rank": self.rank, "world_size": self.world_size, "step": self.step,
                "step_time": round(self.step_time, 3), "time": round(time.time(), 3), "interval": self.interval,
                "timeout": self.timeout, "pid": os.getpid(), "host": socket.gethostname(), "state": state}

    def write(self, state: str = "running") -> None:
        """Replace this rank's file atomically (a watcher never reads half a record); the first record
        that is not `running` is the last one written."""
        path = heartbeat_path(self.output_dir, self.rank)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with self._writing:  # the thread's beat and the main thread's last record share the temporary name
            if self._sealed:
                return
            self._sealed = state != "running"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(self.record(state)), encoding="utf-8")
                os.replace(tmp, path)
            except OSError:
                pass  # a full disk must not end the run here: the checkpoint writer reports it in one line

    def __enter__(self):
        self.write()
        now = time.monotonic()
        self._seen = {p: (None, now) for p in self.peers}
        self._thread = threading.Thread(target=self._run, name="dit-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self.write("done" if exc_type is None else "failed")
        return False

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.write()
            try:
                stale = self._stale_neighbour()
            except Exception as err:  # a fault of the watchdog must not end a run that trains
                print(f"warning: heartbeat watchdog: {type(err).__name__}: {err}", file=sys.stderr)
                continue
            if stale is not None:
                peer, rec, silent = stale
                self.end_run(self._missing_text(peer, rec, f"no heartbeat for {_ago(silent)}"))

    def _stale_neighbour(self):
        """(peer, its record, seconds unchanged) of a running neighbour silent for the timeout, else None."""
        now = time.monotonic()
        for peer in self.peers:
            rec = read_heartbeat(heartbeat_path(self.output_dir, peer))
            if rec is not None and rec.get("state") != "running":
                self._seen[peer] = (None, now)  # finished or failed on its own: nothing to wait for
                continue
            key = rec.get("time") if rec is not None else None
            last, since = self._seen[peer]
            if key != last:
                self._seen[peer] = (key, now)
            elif now - since >= self.timeout:
                return peer, rec, now - since
        return None

    def on_error(self, err: BaseException) -> None:
        """Called with an error of the training loop; ends the run in one line when a peer is missing:
        one whose process on this host is gone, or silent for the timeout, or (once this rank waited the
        timeout in a collective that timed out) silent for a few beats or behind; else returns (re-raise)."""
        if self.world_size == 1:
            return
        # A peer killed a moment ago closed its sockets before it became a zombie: look again for a while.
        waited = time.monotonic() - self._stepped >= self.timeout
        end, line = time.monotonic() + VERDICT_WAIT_S, None
        while line is None and time.monotonic() < end:
            try:
                line = self._verdict(err, waited)
            except Exception:  # a fault of the watchdog must not hide the error it was asked about
                return
            if line is None:
                time.sleep(0.1)
        if line is not None:
            self.end_run(line)

    def _verdict(self, err: BaseException, waited: bool):
        """The line that ends the run for `err`, or None when no peer is missing; `waited`: whether this
        rank had waited the timeout since its last step when the error came."""
        timed_out = waited and "timeout" in str(err).lower().replace("timed out", "timeout")
        peer, rec, why = self._culprit(quiet=max(3 * self.interval, 2.0) if waited else self.timeout, behind=timed_out)
        if peer is not None:
            return self._missing_text(peer, rec, why)
        if timed_out:
            first = (str(err).strip().splitlines() or [""])[0][:200]
            return (f"dit: error: a collective waited parallel.timeout {self.timeout:g} s at step {self.step} for a "
                    f"rank that did not join ({type(err).__name__}: {first}); rank {self.rank} ends the run with exit "
                    f"code {STALLED_EXIT}; {self.output_dir / HEARTBEAT_DIR} shows each rank's last step; "
                    f"{self._saved_text()}")
        return None

    def _culprit(self, quiet: float, behind: bool):
        """(rank, record, why) of the peer most likely missing: one whose process on this host is gone,
        else the longest silent (no write for `quiet` s), else (with `behind`) the furthest behind."""
        now, host, found = time.time(), socket.gethostname(), []
        for peer in range(self.world_size):
            rec = read_heartbeat(heartbeat_path(self.output_dir, peer)) if peer != self.rank else None
            if rec is None or rec.get("state") != "running":
                continue
            age = now - float(rec.get("time", 0))
            if rec.get("host") == host and not _pid_alive(rec.get("pid")):
                found.append((0, 0, peer, rec, f"its process {rec.get('pid')} on this host is gone"))
            elif age >= quiet:
                found.append((1, -age, peer, rec, f"no heartbeat for {_ago(age)}"))
            elif behind and int(rec.get("step", 0)) < self.step:
                lag = now - float(rec.get("step_time", now))
                found.append((2, int(rec["step"]), peer, rec, f"no step for {_ago(lag)} while this rank waited "
                                                              f"at step {self.step}"))
        return min(found)[2:] if found else (None, None, None)

    def _saved_text(self) -> str:
        from dit_trainer.checkpoint.files import latest_checkpoint, step_of

        last = latest_checkpoint(self.output_dir)
        return (f"the last checkpoint saved is step {step_of(last)} ({last}); rerun the same command to resume "
                "from it" if last is not None else "no checkpoint was saved yet; rerun the same command to start again")

    def _missing_text(self, peer: int, rec, why: str) -> str:
        at = f", its last step {rec['step']}" if rec is not None and "step" in rec else ", never seen"
        return (f"dit: error: rank {peer} stopped responding ({why}{at}; parallel.timeout {self.timeout:g} s): "
                f"rank {self.rank} ends the run with exit code {STALLED_EXIT}; {self._saved_text()}")

    def end_run(self, line: str) -> None:
        """Print `line`, mark this rank failed and exit at once (a hung collective cannot be left any
        other way), after any checkpoint being committed on this rank is complete."""
        from dit_trainer.checkpoint.files import COMMIT_LOCK

        if not self._ending.acquire(blocking=False):
            while True:  # the other thread is ending the run: its line is the one to print
                time.sleep(1.0)
        print(line, file=sys.stderr, flush=True)
        self.write("failed")
        COMMIT_LOCK.acquire(timeout=COMMIT_WAIT_S)
        sys.stdout.flush()
        os._exit(STALLED_EXIT)
