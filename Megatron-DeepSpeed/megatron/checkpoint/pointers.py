"""What a checkpoint directory's small files name is data, not a path to follow: the one reading of a pointer
file (`latest`, `latest_universal`, `latest_checkpointed_iteration.txt`) and the one rule for a name that a
pointer or a manifest gives.

A pointer file is read only when it resolves to a regular file inside the checkpoint directory (the trainer
writes plain files; its older saves' links into `.latest.global_stepN/` stay inside), never blocking (a FIFO is refused
before it is opened) and at most POINTER_BYTES of it. A name it or a manifest gives must resolve, links
included, to a path inside the directory it is relative to. Every refusal is one InputError line that quotes at
most a short prefix of what the file holds.
"""
import os
import stat
from typing import Optional

from megatron.errors import InputError

POINTER_BYTES = 256  # `global_step` and an iteration number fit many times over
_QUOTED_CHARACTERS = 40


def quoted(text: str) -> str:
    """`text` as an error message may show it: repr'd, and cut short when long."""
    short = text if len(text) <= _QUOTED_CHARACTERS else text[:_QUOTED_CHARACTERS] + "..."
    return repr(short) + (f" ({len(text)} characters)" if len(text) > _QUOTED_CHARACTERS else "")


def inside(directory: str, name: str, named_by: str) -> str:
    """The path of `name` under `directory` after resolving every link and '..' in it; an InputError naming
    `named_by` (the file that gave the name) when it leads outside `directory`."""
    root = os.path.realpath(directory)
    resolved = os.path.realpath(os.path.join(directory, name))
    if os.path.commonpath([root, resolved]) != root:
        raise InputError(f"{named_by} names {quoted(name)}, which leads outside {directory} (to {resolved}); a "
                         f"checkpoint's files must all be inside it: write a checkpoint name such as "
                         f"'global_step1000' there, or restore the file")
    return os.path.join(directory, name)


def read_pointer(directory: str, pointer: str) -> Optional[str]:
    """The stripped text of `directory`'s pointer file `pointer`; None when there is no such file."""
    path = os.path.join(directory, pointer)
    if not os.path.lexists(path):
        return None
    inside(directory, pointer, path)
    fix = f"write the name of a complete checkpoint into {path}, or point at another checkpoint directory"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise InputError(f"{path} is not a regular file (a FIFO, device or directory?); {fix}")
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(descriptor, "rb") as handle:
            data = handle.read(POINTER_BYTES + 1)
    except OSError as err:
        raise InputError(f"{path} cannot be read ({err.strerror or err}); it names the checkpoint to resume: "
                         f"restore it or fix its permissions, or point at another checkpoint directory") from None
    if len(data) > POINTER_BYTES:
        raise InputError(f"{path} holds more than {POINTER_BYTES} bytes, far more than a checkpoint name; {fix}")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text (it holds {quoted(data.decode('utf-8', 'replace'))}); "
                         f"{fix}") from None
