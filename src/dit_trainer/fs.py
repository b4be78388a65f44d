"""File-system faults as one line: files that are not regular files, full disks and failing writes.

Opening a FIFO for reading blocks until something writes into it (a SIGTERM does not end the
wait), and a device can be read forever, so every file the package reads is checked to be a
regular file first. A write that fails (a full disk, a quota, an I/O error, a read-only mount)
is told in one line naming the path, the cause and, where known, the bytes it needed.
Torch-free: the config and data layers use it too.
"""

import contextlib
import errno
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from dit_trainer.errors import DitError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def not_regular(path):
    """What `path` is when it exists but is no regular file (symlinks followed), else None."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # ValueError: a NUL in a name read from a damaged file
        return None  # a missing file is the reader's to report, with its own advice
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def check_regular(path, error=DitError, what: str = "") -> None:
    """Raise `error` in one line when `path` exists but is a FIFO, device, socket or folder:
    reading one would block or never end. `what` says what the file was meant to be."""
    kind = not_regular(path)
    if kind is not None:
        meant = f" ({what})" if what else ""
        raise error(f"{path}{meant} is {kind}, not a regular file; replace it with the real file or remove it")


def check_output_path(path, flag: str, error=DitError, folder: bool = False, suffixes=()) -> None:
    """A one-line `error` before any work when `path` cannot be written as a file (`folder`: as a
    folder): a folder where a file goes or the reverse, a file where a parent folder goes, an ending
    none of `suffixes`, or a parent that is not writable. `flag` names the option (--out)."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if not str(path).strip():
        raise error(f"{flag} is empty; name the {'folder' if folder else 'file'} to write")
    if folder and p.exists() and not p.is_dir():
        raise error(f"{flag} {path} is a file; pass a folder to write into (a new one is created)")
    if not folder and p.is_dir():
        example = p / f"samples{suffixes[0] if suffixes else ''}"
        raise error(f"{flag} {path} is a folder; name a file in it, e.g. {example}")
    if suffixes and p.suffix.lower() not in suffixes:
        shown = ", ".join(suffixes[:6]) + (", ..." if len(suffixes) > 6 else "")
        raise error(f"{flag} {path}: the ending {p.suffix or '(none)'} is not one of {shown}; "
                    f"name the file like samples{suffixes[0]}")
    parent = p.parent if not folder or not p.exists() else p
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise error(f"{flag} {path}: {parent} is a file, not a folder; pick another path")
    if not os.access(parent, os.W_OK):
        raise error(f"{flag} {path}: {parent} is not writable; pick another path or fix its permissions")


def free_bytes(path):
    """Bytes free for an unprivileged writer on the file system of `path` (its nearest existing folder), or None."""
    path = os.path.abspath(os.fspath(path))
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def tree_bytes(path) -> int:
    """The bytes of the files under `path` (a file's own size for a file); 0 when missing."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def size_text(n) -> str:
    """A byte count for people: 1.2 GB, 340 MB, 12 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


# Causes the user fixes with the disk (space, quota, permissions), not with the code.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS, errno.EACCES, errno.EPERM)


def cause_of(err: BaseException) -> str:
    """The cause of a failed write in one line: the OS's words, or the last line of torch's or
    safetensors' message (they report a full disk as RuntimeError / SafetensorError)."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    lines = str(err).strip().splitlines()
    text = lines[-1] if lines else type(err).__name__
    return "No space left on device" if "os error 28" in text or "No space left" in text else text


def write_error_text(path, err: BaseException, needed=None, exact: bool = False) -> str:
    """`cannot write PATH: CAUSE (needs about N, F free)`: one line for any failed write (`exact`: name
    `path` itself, not the file the error names, a temporary one that is gone)."""
    where = path if exact else getattr(err, "filename", None) or path
    text = f"cannot write {where}: {cause_of(err)}"
    free = free_bytes(path)
    if needed:
        text += f" (it needs about {size_text(needed)}" + (f"; {size_text(free)} free)" if free is not None else ")")
    elif free is not None and isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        text += f" ({size_text(free)} free)"
    return text


def warn_low_space(path, needed, what: str) -> bool:
    """Print one warning line when the disk of `path` has less than `needed` bytes free; True if it did."""
    free = free_bytes(path)
    if not needed or free is None or free >= needed:
        return False
    print(f"warning: {size_text(free)} free under {path}, and {what} takes about {size_text(needed)}: "
          "the write will likely fail; free space now", file=sys.stderr, flush=True)
    return True


def disk_error(err: BaseException) -> bool:
    """Whether a failed write is the disk's fault (full, quota, read-only, I/O), not the code's: an OSError
    of DISK_ERRNOS, or torch's / safetensors' wording of one."""
    if isinstance(err, OSError):
        return err.errno in DISK_ERRNOS
    text = str(err)
    return isinstance(err, Exception) and any(
        s in text for s in ("No space left", "os error 28", "os error 122", "file write failed"))


def refuse_existing(path, flag: str, error=DitError, own=None) -> None:
    """A one-line `error` when `path` is a file, or a folder holding anything, that this command did not
    write: `own(path)` says whether it is the command's own work (resumed, not replaced)."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if not os.path.lexists(p) or (own is not None and own(p)):
        return
    if p.is_dir():
        entries = sorted(os.listdir(p))
        if not entries:
            return
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise error(f"{flag} {path} already holds files ({shown}); pass a new {flag} "
                    "or --overwrite to replace it")
    raise error(f"{flag} {path} already exists; pass another {flag} or --overwrite to replace it")


def _failed(tmp: Path, target, err: BaseException, error):
    """Remove the temporary `tmp`; a disk's failure becomes one `error` line naming `target`."""
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            tmp.unlink()
    if disk_error(err):
        return error(f"{write_error_text(target, err, exact=True)}; nothing was kept (the partial copy is "
                     "removed): free space or fix the permissions, then rerun")
    return None


@contextlib.contextmanager
def staged_folder(out, replace: bool = False, error=DitError):
    """A fresh hidden folder beside `out` to write into: renamed to `out` when the block ends (an `out`
    holding files is replaced only when `replace`), removed when it fails, so `out` is whole or untouched."""
    out = Path(os.path.expanduser(os.fspath(out)))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as err:
        raise (error(write_error_text(out, err)) if disk_error(err) else err) from None
    aside = None
    try:
        yield tmp
        if replace and out.is_dir() and os.listdir(out):
            aside = tmp.with_suffix(".old")  # unique as tmp's name is
            os.replace(out, aside)
        os.replace(tmp, out)  # onto a missing or empty folder
        if aside is not None:
            if aside.is_symlink():  # OUT was a link: the link goes, what it pointed at stays
                aside.unlink()
            else:
                shutil.rmtree(aside, ignore_errors=True)
    except BaseException as err:
        if aside is not None and aside.is_dir() and not out.exists():
            os.replace(aside, out)  # the old folder back where the new one failed to go
        mapped = _failed(tmp, out, err, error)
        if mapped is None:
            raise
        raise mapped from None


@contextlib.contextmanager
def staged_file(path, error=DitError):
    """A temporary name beside `path` to write: renamed to `path` when the block ends, removed when it fails."""
    path = Path(os.path.expanduser(os.fspath(path)))
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        mapped = _failed(tmp, path, err, error)
        if mapped is None:
            raise
        raise mapped from None
