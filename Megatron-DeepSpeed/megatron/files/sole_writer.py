"""One writer at a time for an output that is more than one file (a dataset's .bin and .idx): a second writer is
refused at once, naming the first, instead of the two publishing their files in turn so that the pair on disk
comes from different runs.

An advisory POSIX lock (fcntl, dropped by the kernel however the holder ends) on a lock file beside the output,
taken without waiting. The holder removes the file before it lets go; a writer that locked a file already
removed (its inode is no longer the path's) tries again on the path's current file.
"""
import errno
import fcntl
import json
import os
import socket


class SoleWriter:
    """Holds `lock_path` exclusively from construction to release(); `refuse(holder)` builds the exception
    raised when another process holds it (holder: 'pid P on host H')."""

    def __init__(self, lock_path: str, refuse):
        self.path = lock_path
        self._descriptor = self._take(refuse)

    def _take(self, refuse) -> int:
        while True:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = os.pread(descriptor, 512, 0).decode("utf-8", "replace")
                os.close(descriptor)
                if err.errno in (errno.EACCES, errno.EAGAIN):
                    raise refuse(_describe(holder)) from None
                raise
            if _same_file(descriptor, self.path):
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
                return descriptor
            os.close(descriptor)  # locked a file its holder had just removed: take the current one

    def release(self) -> None:
        """Remove the lock file and let go; safe to call more than once."""
        if self._descriptor is None:
            return
        if _same_file(self._descriptor, self.path):
            os.unlink(self.path)
        os.close(self._descriptor)
        self._descriptor = None


def _same_file(descriptor: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        return False


def _describe(record: str) -> str:
    try:
        holder = json.loads(record)
        return f"pid {holder['pid']} on host {holder['host']}"
    except (ValueError, KeyError, TypeError):
        return "another process"
