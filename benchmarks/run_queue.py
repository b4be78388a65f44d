"""How long a process waited for a core while it could have run: Linux's per-task run-queue
delay (/proc/<pid>/task/<tid>/schedstat, second field), for telling a slow step from a busy machine.

On a shared machine other users' work takes cores from a benchmark; the time its threads spent
runnable but not running says how much. `hardware_profile.py` takes it out of the rates it
measures, and `plan_check.py` out of measured step times beyond what its own processes (more
ranks than cores) make each other wait.
"""

import os
import time


def run_delay_s(tid=None) -> float:
    """Seconds thread `tid` (default: this process's main thread) has waited on a run queue."""
    tid = tid or os.getpid()
    with open(f"/proc/{os.getpid()}/task/{tid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


class Waited:
    """`with Waited() as w: ...` then `w.wall`, `w.waited` (seconds) and `w.share` (waited / wall)
    of this process's main thread."""

    def __enter__(self):
        self._t0, self._d0 = time.perf_counter(), run_delay_s()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._t0
        self.waited = run_delay_s() - self._d0

    @property
    def share(self) -> float:
        return self.waited / self.wall if self.wall > 0 else 0.0
