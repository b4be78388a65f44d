"""Stopping cleanly on SIGTERM/SIGINT: what schedulers send before they pre-empt a job.

The first signal only sets a flag; the trainer finishes the step it is in, all ranks agree to
stop (one tiny all-reduce per step, shared with the divergence check), a checkpoint is written
and `dit train` exits 0. A second SIGINT (Ctrl-C again) raises KeyboardInterrupt at once.
"""

import signal
import sys
import threading


class StopSignals:
    """Context manager that turns SIGTERM/SIGINT into a stop request: `on_request(signal name)` is
    called and `.requested` names the signal."""

    def __init__(self, on_request=None):
        self.requested = None
        self.on_request = on_request
        self._previous = {}

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, without saving
        if self.requested is None:
            print(f"{name} received: finishing this step, saving a checkpoint and stopping "
                  "(Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
        self.requested = name
        if self.on_request is not None:
            self.on_request(name)

    def __enter__(self):
        # Handlers can only be installed from the main thread (a trainer in a worker thread keeps them as they are).
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False
