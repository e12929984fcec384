"""Every file of a checkpoint checked before use, so that a missing, short or foreign file is named in one line
instead of surfacing as DeepSpeed's assertion, a size mismatch or an UnpicklingError on every rank.

Each checkpoint gets `global_stepN/manifest.json`: every file under it with its size and a cheap checksum, the
CRC-32 of its first and last MiB (the end of torch's zip format is its directory, which holds the CRC of every
record, so the checksum covers the contents without reading them). Checkpoints without one (older ones,
upstream's) are checked from their layout by directory.check_layout_files: each file the layout needs exists, is
a whole torch file, and holds what its name says.
"""
import json
import os
import zipfile
import zlib
from typing import Dict

from megatron.checkpoint.file_names import LATEST_TAG_FILE, MANIFEST_FILE
from megatron.checkpoint.pointers import inside, quoted
from megatron.errors import InputError
from megatron.files.atomic import write_text_atomically

_ENDS = 1 << 20  # bytes read at each end of a file for its checksum
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format is a zip archive
_PICKLE_MAGIC = b"\x80"  # torch's legacy format starts with a pickle protocol opcode
_SMALLEST_ZIP = 22  # an empty archive: its end-of-directory record alone
_FORMAT = 1
OPTIMIZER_FILE_END = "_optim_states.pt"  # DeepSpeed's ZeRO partitions


def checksum(path: str) -> str:
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        crc = zlib.crc32(handle.read(_ENDS))
        if size > _ENDS:
            handle.seek(max(_ENDS, size - _ENDS))
            crc = zlib.crc32(handle.read(), crc)
    return f"{crc:08x}"


def _listing(step_dir: str) -> Dict[str, dict]:
    files = {}
    for parent, _, names in os.walk(step_dir):
        for name in names:
            path = os.path.join(parent, name)
            relative = os.path.relpath(path, step_dir)
            if relative != MANIFEST_FILE:
                files[relative] = {"bytes": os.path.getsize(path), "crc32_ends": checksum(path)}
    return dict(sorted(files.items()))


def write_manifest(step_dir: str) -> None:
    """Record every file now under `step_dir` (call once all of them are written)."""
    text = json.dumps({"format": _FORMAT, "files": _listing(step_dir)}, indent=1)
    write_text_atomically(os.path.join(step_dir, MANIFEST_FILE), text + "\n")


def _restore_hint(step_dir: str) -> str:
    latest = os.path.join(os.path.dirname(os.path.abspath(step_dir)), LATEST_TAG_FILE)
    return (f"restore it from the checkpoint's source, or resume from an older one (write its global_stepN "
            f"into {latest})")


def check_manifest(step_dir: str, whole: bool = True, optimizer: bool = True) -> bool:
    """Compare the files under `step_dir` with its manifest; False when it has none. A missing (unless not
    `whole`: a reader of one shard may hold only its files; nor, without `optimizer`, an optimizer partition a
    weights-only load does not read), short or changed file is an InputError naming it."""
    path = os.path.join(step_dir, MANIFEST_FILE)
    if not os.path.isfile(path):
        return False
    listed = _read_listing(path)
    for name, recorded in listed.items():
        file = inside(step_dir, name, path)
        if not os.path.isfile(file) and not (whole and (optimizer or not name.endswith(OPTIMIZER_FILE_END))):
            continue
        if not os.path.isfile(file):
            raise InputError(f"checkpoint file {file} is missing (the checkpoint's manifest lists it); "
                             f"{_restore_hint(step_dir)}")
        require_readable(file)
        size = os.path.getsize(file)
        if size != recorded["bytes"]:
            raise InputError(f"checkpoint file {file} has {size} bytes, but {recorded['bytes']} were written (its "
                             f"manifest): it is truncated or another file; {_restore_hint(step_dir)}")
        if checksum(file) != recorded["crc32_ends"]:
            raise InputError(f"checkpoint file {file} is not the file this checkpoint wrote (its checksum differs "
                             f"from the manifest's); {_restore_hint(step_dir)}")
    return True


def _read_listing(path: str) -> Dict[str, dict]:
    """The manifest's `files`: a non-empty mapping of names to {bytes, crc32_ends}, or an InputError."""
    fix = "restore it, or delete it to check the checkpoint from its layout instead"
    try:
        with open(path, encoding="utf-8") as handle:
            listed = json.load(handle)["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path} cannot be read as a checkpoint manifest ({err}); {fix}") from None
    if not isinstance(listed, dict) or not listed:
        raise InputError(f"{path}: 'files' is {quoted(json.dumps(listed))}, not a mapping of the checkpoint's "
                         f"files to their sizes and checksums; {fix}")
    for name, recorded in listed.items():
        if not (isinstance(recorded, dict) and type(recorded.get("bytes")) is int
                and isinstance(recorded.get("crc32_ends"), str)):
            raise InputError(f"{path}: the entry of {quoted(name)} is {quoted(json.dumps(recorded))}, not "
                             f"{{\"bytes\": N, \"crc32_ends\": \"...\"}}; {fix}")
    return listed


def require_readable(path: str) -> None:
    """An InputError naming checkpoint file `path` when this process may not read it."""
    if not os.access(path, os.R_OK):
        raise InputError(f"checkpoint file {path} cannot be read (permission denied for this user); fix its "
                         f"permissions, or point at a checkpoint this user can read")


def is_zip_archive(path: str) -> bool:
    """Whether `path` is in torch's zip format (which torch.load can memory-map), not its legacy pickle format."""
    with open(path, "rb") as handle:
        return handle.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC


def check_torch_file(path: str) -> None:
    """`path` exists and is a whole torch file: a zip archive with its closing directory (which a truncated copy
    or an interrupted write lacks), or torch's legacy pickle format."""
    step_dir = os.path.dirname(path)
    if not os.path.isfile(path):
        raise InputError(f"checkpoint file {path} is missing; {_restore_hint(step_dir)}")
    require_readable(path)
    with open(path, "rb") as handle:
        head = handle.read(len(_ZIP_MAGIC))
    size = os.path.getsize(path)
    if head.startswith(_PICKLE_MAGIC) and size > _SMALLEST_ZIP:
        return
    if head != _ZIP_MAGIC or size < _SMALLEST_ZIP or not zipfile.is_zipfile(path):
        what = "is not a torch file" if size >= _SMALLEST_ZIP and not _ZIP_MAGIC.startswith(head) else "is truncated"
        raise InputError(f"checkpoint file {path} {what} ({size} bytes, no end of archive): the save or a copy of "
                         f"it was interrupted, or it was replaced; {_restore_hint(step_dir)}")
