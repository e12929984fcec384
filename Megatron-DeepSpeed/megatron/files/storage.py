"""Facts about the file system a run writes to: flushing files to disk, and saying in words why a write
failed. torch.save reports a full disk as an opaque RuntimeError ("unexpected pos ...", "basic_ios::clear"),
so where the error carries no errno the cause is inferred from the directory: read-only mount, missing
write permission, the file-size limit (ulimit -f), or less free space than the write needs."""
import errno
import os
import resource
import shutil
from typing import Optional

_CAUSES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EFBIG: "a file exceeds the file-size limit",
}


def megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


def fsync_tree(directory: str) -> None:
    """Flush every file under `directory`, then the directories, to disk (a file written by another process
    is flushed too: fsync acts on the file, not on the descriptor that wrote it)."""
    for root, _, files in os.walk(directory):
        for name in files:
            _fsync_path(os.path.join(root, name))
        _fsync_path(root)


def fsync_directory(directory: str) -> None:
    """Make the renames done in `directory` durable."""
    _fsync_path(directory)


def _fsync_path(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def directory_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, files in os.walk(directory) for name in files)


def free_bytes(directory: str) -> Optional[int]:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def file_size_limit() -> Optional[int]:
    """This process's file-size limit in bytes (ulimit -f), None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _inferred_errno(directory: str, needed_bytes: int) -> Optional[int]:
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return errno.EROFS
    except OSError:
        return None
    if not os.access(directory, os.W_OK):
        return errno.EACCES
    if file_size_limit() is not None:
        return errno.EFBIG
    free = free_bytes(directory)
    if free is not None and free < needed_bytes:
        return errno.ENOSPC
    return None


def _space_figures(free: Optional[int], needed_bytes: int) -> str:
    """Free against needed space, worded so that more free than estimated (the failed write's files are gone,
    or the estimate was low) does not read as a contradiction."""
    if free is None or free < needed_bytes:
        shown = megabytes(free) if free is not None else "unknown"
        return f": {shown} free there, about {megabytes(needed_bytes)} needed"
    return (f": {megabytes(free)} free there now that the failed write's files are gone, yet it ran out while "
            f"writing: it needs more than the estimated {megabytes(needed_bytes)}, or something else fills that disk")


def write_failure_cause(directory: str, error: BaseException, needed_bytes: int) -> str:
    """Why writing about `needed_bytes` into `directory` failed with `error`, in words, with the figures
    that matter (free space, the file-size limit)."""
    return storage_cause(directory, error, needed_bytes) or f"{type(error).__name__}: {error}"


def storage_cause(directory: str, error: BaseException, needed_bytes: int) -> Optional[str]:
    """write_failure_cause's words when the storage explains `error` (a full disk, a read-only mount ...), else
    None: a failure of another kind is no storage fault."""
    code = error.errno if isinstance(error, OSError) and error.errno else _inferred_errno(directory, needed_bytes)
    if code not in _CAUSES:
        return None
    cause = f"{_CAUSES[code]} ({errno.errorcode[code]})"
    if code in (errno.ENOSPC, errno.EDQUOT):
        cause += _space_figures(free_bytes(directory), needed_bytes)
    elif code == errno.EFBIG and file_size_limit() is not None:
        cause += f": ulimit -f allows {file_size_limit()} bytes per file"
    return cause
