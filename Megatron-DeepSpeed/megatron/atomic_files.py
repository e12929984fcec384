"""Writing a file so that no reader ever sees it half-written: write a temporary beside it, then rename."""
import os
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
