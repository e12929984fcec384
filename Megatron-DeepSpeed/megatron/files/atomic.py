"""Writing a file (or a directory) so that no reader ever sees it half-written: write a temporary beside it, then
rename. A directory has one writer at a time (files/sole_writer.py), never replaces what it reads, and never
replaces what appeared while it was written."""
import glob
import logging
import os
import shutil
import tempfile
from typing import BinaryIO, Callable, Mapping

from megatron.errors import InputError, RunError
from megatron.files.sole_writer import SoleWriter
from megatron.files.storage import directory_bytes, storage_cause

_log = logging.getLogger(__name__)


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


def require_writable_place(flag: str, path: str) -> None:
    """Refuse, before any work, a file `flag` `path` whose directory is missing or not writable: the write
    at the end would fail after all of it."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"{flag} {path}: directory {directory} does not exist; create it or choose another path")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: directory {directory} is not writable; fix its permissions or choose "
                         "another path")


def write_text_atomically(path: str, text: str) -> None:
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")))


def check_output_directory(flag: str, path: str, force: bool, inputs: Mapping[str, str]) -> None:
    """Refuse, before any work, an output directory `flag` `path` that exists (unless force) or that overlaps one
    of `inputs` (refuse_overlap)."""
    refuse_overlap(flag, path, inputs)
    if os.path.lexists(path) and not force:
        raise InputError(f"{flag} {path} already exists; choose another directory, or pass --force to replace it")


def refuse_overlap(flag: str, path: str, inputs: Mapping[str, str]) -> None:
    """Refuse an output directory `flag` `path` that is, contains or lies inside one of `inputs` ({what: path}):
    replacing it would destroy what is read, with --force too."""
    output = os.path.realpath(path)
    for input_flag, input_path in inputs.items():
        source = os.path.realpath(input_path)
        relation = ("is" if output == source else "contains" if source.startswith(output + os.sep) else
                    "lies inside" if output.startswith(source + os.sep) else None)
        if relation:
            raise InputError(f"{flag} {path} {relation} {input_flag} {input_path}: the output would replace or "
                             f"change what is read (--force or not); choose a directory apart from the input")


def write_directory_atomically(path: str, fill: Callable[[str], object], force: bool = False) -> None:
    """Call fill(temporary directory) beside path, then rename it to path, so a reader sees the whole directory
    or nothing. An existing path is an error unless force; then it is replaced only once the new one is
    complete. One writer at a time (a lock file beside path); a path that appears while fill runs is kept and
    the new directory dropped, with an error. A failure removes the temporary directory and leaves path as it
    was; a temporary that a killed writer left is removed by the next writer of path."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        writer = SoleWriter(path + ".lock", lambda holder: InputError(
            f"{path} is being written by another process ({holder}); wait for it to finish, or choose another "
            "directory"))
    except OSError as err:
        raise InputError(f"cannot write in {parent} ({err.strerror}); choose another directory") from err
    try:
        existed = os.path.lexists(path)
        if existed and not force:
            raise InputError(f"{path} already exists; choose another directory, or pass --force to replace it")
        _remove_stale_temporaries(path)
        _replace_with_filled(path, fill, existed)
    finally:
        writer.release()


def _remove_stale_temporaries(path: str) -> None:
    """With the lock held no other writer of path runs: a temporary beside it is a killed writer's."""
    for stale in glob.glob(glob.escape(path) + ".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
        _log.info(f"removed {stale}, left by a writer of {path} that was killed")
    for kept in glob.glob(glob.escape(path) + ".old-*"):
        _log.warning(f"{kept} holds the {path} that a killed writer was replacing; move it back or remove it")


def _replace_with_filled(path: str, fill: Callable[[str], object], existed: bool) -> None:
    parent = os.path.dirname(path)
    temporary = tempfile.mkdtemp(dir=parent, prefix=f"{os.path.basename(path)}.tmp-")
    try:
        _fill_or_explain(path, fill, temporary)
        os.chmod(temporary, 0o755)
        replaced = None
        if os.path.lexists(path):
            if not existed:
                raise InputError(f"{path} appeared while this run wrote it and is left as it is; nothing was "
                                 "written: choose another directory, or remove it and run again")
            replaced = tempfile.mkdtemp(dir=parent, prefix=f"{os.path.basename(path)}.old-")
            os.replace(path, os.path.join(replaced, "old"))
        os.replace(temporary, path)
        if replaced is not None:
            shutil.rmtree(replaced)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _fill_or_explain(path: str, fill: Callable[[str], object], temporary: str) -> None:
    """fill(temporary); a write the storage refused (a full disk: torch and safetensors name it in words of their
    own) becomes one line saying so."""
    try:
        fill(temporary)
    except (InputError, RunError):
        raise
    except Exception as err:
        cause = storage_cause(temporary, err, directory_bytes(temporary))
        if cause is None:
            raise
        raise RunError(f"writing {path} failed: {cause}; its partial files were removed and {path} is as it was: "
                       "make room (or choose another directory) and run again") from err
