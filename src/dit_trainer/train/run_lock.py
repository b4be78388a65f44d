"""One writer per run folder: an advisory `fcntl.flock` on `output_dir/.dit-train.lock`, held for the run.

Two `dit train` on one folder would interleave `metrics.jsonl` and rotate each other's
checkpoints. The first takes the lock (rank 0 under torchrun) and writes its pid and host into
the file; a second is refused in one line naming them. The kernel drops the lock when the
process ends, even by kill -9, so a stale file never blocks a rerun. The file stays (deleting a
lock file races with the next run taking it).
"""

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from dit_trainer.errors import CheckpointError
from dit_trainer.fs import write_error_text
from dit_trainer.parallel.utils import from_main
from dit_trainer.train.preflight import check_output_dir, check_writable

LOCK_NAME = ".dit-train.lock"


def holder_text(path) -> str:
    """Who holds the lock, from what they wrote into it: `pid 123 on host h since ...`."""
    try:
        info = json.loads(Path(path).read_text())
        return f"pid {int(info['pid'])} on host {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its pid yet"


class RunLock:
    """Context manager holding the run lock of `output_dir` on the main rank; every rank raises the
    same one-line CheckpointError when it cannot be taken."""

    def __init__(self, output_dir, is_main: bool):
        self.path = Path(output_dir) / LOCK_NAME
        self.output_dir, self.is_main = output_dir, is_main
        self._fd = None

    def __enter__(self):
        error = None
        if self.is_main:
            try:
                self._acquire()
            except CheckpointError as err:
                error = str(err)
        error = from_main(error)
        if error is not None:
            raise CheckpointError(error)
        return self

    def _acquire(self) -> None:
        import fcntl

        check_output_dir(self.output_dir)
        check_writable(self.output_dir)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise CheckpointError(f"{write_error_text(self.path, err)}; fix the permissions of {self.output_dir}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                # A file system without flock (some network mounts): warn, and run unlocked as before.
                os.close(fd)
                print(f"warning: cannot lock {self.path} ({err.strerror}); make sure no other dit train writes "
                      f"into {self.output_dir}", file=sys.stderr)
                return
            os.close(fd)
            raise CheckpointError(
                f"output_dir {self.output_dir} is in use by another dit train ({holder_text(self.path)}); wait for it "
                "to finish or stop it, or pass another output_dir") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
        except OSError as err:
            os.close(fd)
            raise CheckpointError(f"{write_error_text(self.path, err)}; free space in {self.output_dir} or fix "
                                  "its permissions") from None
        self._fd = fd

    def __exit__(self, *exc):
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        return False
