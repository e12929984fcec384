"""One writer per --save: two runs saving into one directory would overwrite each other's checkpoints, and the
later one's saves would be skipped where `latest` already names their step.

The saving rank (global rank 0) holds an advisory POSIX lock (fcntl) on `--save/.save.lock` for the run's life;
the kernel drops it when the process ends in any way (SIGKILL and crashes included). The file records the
holder (host, pid, start, command): a second run stops at start-up naming it. The file is never removed (a
removed lock file could be locked by two runs at once, each on its own inode); a clean end empties it, so a
file that still names a holder while nobody holds the lock was left by a run that died: that stale lock is
reported with its host and pid, and taken over.

Across nodes the guarantee is the file system's: local disks and NFSv4 (and NFSv3 with lockd) honour POSIX
locks between hosts; a file system that refuses locks is reported, and then nothing is guaranteed.
"""
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from typing import Dict

from megatron.errors import InputError

_log = logging.getLogger(__name__)

LOCK_FILE = ".save.lock"
_held: Dict[str, int] = {}  # real path of a --save -> descriptor holding its lock, in this process


def _holder_record() -> str:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "command": " ".join(sys.argv)[:300]})


def describe_holder(text: str) -> str:
    """'host H, pid P, started T: command' from a lock file's record (its raw text if that is not one)."""
    try:
        record = json.loads(text)
        return f"host {record['host']}, pid {record['pid']}, started {record['started']}: {record['command']}"
    except (ValueError, KeyError, TypeError):
        return f"unreadable record {text[:80]!r}"


def _read(descriptor: int) -> str:
    os.lseek(descriptor, 0, os.SEEK_SET)
    return os.read(descriptor, 4096).decode("utf-8", "replace").strip()


def _write(descriptor: int, text: str) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, text.encode("utf-8"), 0)
    os.fsync(descriptor)


def hold(save_dir: str) -> None:
    """Take --save's lock for this process (again: a no-op), or raise an InputError naming the run holding it."""
    key = os.path.realpath(save_dir)
    if key in _held:
        return
    path = os.path.join(save_dir, LOCK_FILE)
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise InputError(f"--save {save_dir}: cannot create its lock file {path} ({err.strerror}); fix the "
                         "directory's permissions or choose another --save") from err
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = _read(descriptor)
        os.close(descriptor)
        if err.errno in (errno.EACCES, errno.EAGAIN):
            raise InputError(f"--save {save_dir} is in use by another run ({describe_holder(holder)}); two runs "
                             "saving into one directory overwrite each other's checkpoints: wait for it to end, "
                             "or choose another --save") from None
        _log.warning(f"--save {save_dir}: its file system refuses locks ({err.strerror}); nothing stops another "
                     "run from saving there at the same time")
        return
    previous = _read(descriptor)
    if previous:
        _log.warning(f"--save {save_dir}: the run that last saved there ended without releasing it "
                     f"({describe_holder(previous)}; that process is gone); this run takes it over")
    _write(descriptor, _holder_record())
    _held[key] = descriptor


def release_all() -> None:
    """Empty and unlock the lock files this process holds (a clean end: no stale lock remains)."""
    while _held:
        _, descriptor = _held.popitem()
        try:
            _write(descriptor, "")
        finally:
            os.close(descriptor)  # closing the descriptor drops the lock
