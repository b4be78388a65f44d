"""Stopping cleanly on SIGTERM/SIGINT: what schedulers send before they pre-empt a job.

The first signal only sets a flag; the trainer finishes the step it is in, all ranks agree to
stop (one tiny all-reduce per step, shared with the divergence check), a checkpoint is written
and `dit train` exits 0. A second SIGINT (Ctrl-C again) raises KeyboardInterrupt at once.
"""

import os
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
        self._sigints = 0
        self._pipe = self._old_wakeup = None

    def _count_sigints(self) -> int:
        """SIGINTs delivered so far. Python runs a handler once for signals that arrive together (two
        Ctrl-C within one long tensor op), but the C handler writes one byte per delivery to the
        wakeup fd; counting those tells a second Ctrl-C from the first."""
        if self._pipe is None:
            return self._sigints + 1
        try:
            while True:
                data = os.read(self._pipe[0], 512)
                if not data:
                    break
                self._sigints += data.count(bytes([signal.SIGINT]))
        except BlockingIOError:
            pass
        return self._sigints

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        seen = self._count_sigints() if signum == signal.SIGINT else 0
        if signum == signal.SIGINT and (self.requested is not None or seen >= 2):
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, without saving
        first = self.requested is None
        # Set before printing: a signal arriving during the print runs this handler again, nested.
        self.requested = name
        if first:
            print(f"{name} received: finishing this step, saving a checkpoint and stopping "
                  "(Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
        if self.on_request is not None:
            self.on_request(name)

    def __enter__(self):
        # Handlers can only be installed from the main thread (a trainer in a worker thread keeps them as they are).
        if threading.current_thread() is threading.main_thread():
            self._pipe = os.pipe()
            for fd in self._pipe:
                os.set_blocking(fd, False)
            self._old_wakeup = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        return False
