"""Writing a file (or a directory) so that no reader ever sees it half-written: write a temporary beside it, then
rename."""
import os
import shutil
import tempfile
from typing import BinaryIO, Callable

from megatron.errors import InputError


def write_atomically(path: str, write: Callable[[BinaryIO], object]) -> None:
    """Call write(binary file) on a temporary in path's directory, flush it to disk, then rename it over path.
    A failure leaves nothing behind and the old file, if any, untouched. The result is world-readable like
    any report (mkstemp alone would make it private)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"cannot write {path}: directory {directory} does not exist; create it or "
                         f"choose another path")
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def write_text_atomically(path: str, text: str) -> None:
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")))


def write_directory_atomically(path: str, fill: Callable[[str], object], force: bool = False) -> None:
    """Call fill(temporary directory) beside path, then rename it to path, so a reader sees the whole directory
    or nothing. An existing path is an error unless force; then it is replaced only once the new one is
    complete. A failure removes the temporary directory and leaves path as it was."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not force:
        raise InputError(f"{path} already exists; choose another directory, or pass --force to replace it")
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create {parent} ({err.strerror}); choose another directory") from err
    temporary = tempfile.mkdtemp(dir=parent, prefix=f"{os.path.basename(path)}.tmp-")
    try:
        fill(temporary)
        os.chmod(temporary, 0o755)
        replaced = None
        if os.path.exists(path):
            replaced = tempfile.mkdtemp(dir=parent, prefix=f"{os.path.basename(path)}.old-")
            os.replace(path, os.path.join(replaced, "old"))
        os.replace(temporary, path)
        if replaced is not None:
            shutil.rmtree(replaced)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
