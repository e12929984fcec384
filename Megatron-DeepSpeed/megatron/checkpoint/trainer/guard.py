"""Start-up checks of --load and --save, so that a mistyped path is refused before any training and nothing a
user has is overwritten (resume_plan.py then checks what the checkpoint holds against the run).

- --load equal to --save (upstream's resume idiom) may be missing or empty: the run starts fresh. A --load
  that differs from --save must hold a checkpoint, or the run stops naming the path.
- A run never saves into a directory whose `latest` is newer than the iteration it starts from: its saves
  would overwrite that run's later checkpoints and roll `latest` back.
- --save must be a writable directory now, not at the first save hours later.
- The checkpoint to resume is complete: `latest` names an existing step, and its files are there, whole and
  what they should be (checkpoint/manifest.py), and hold data only (checkpoint/trust.py); all checked before
  DeepSpeed opens any.
"""
import logging
import os
import tempfile
from typing import Optional, Sequence

from megatron.checkpoint import manifest, trust
from megatron.checkpoint.formats.detect import read_client_state
from megatron.checkpoint.formats.locate import read_latest_iteration, read_latest_tag
from megatron.checkpoint.file_names import LATEST_TAG_FILE, LATEST_UNIVERSAL_FILE, MEGATRON_ITER_PATTERN, TAG_PATTERN
from megatron.errors import InputError

_log = logging.getLogger(__name__)


def latest_tag(directory: str) -> Optional[str]:
    """The checkpoint `latest` names in `directory`; None when there is no `latest` (no checkpoint yet).
    A `latest` that cannot be read or names no existing step is an InputError naming the file."""
    tag = read_latest_tag(directory)
    if tag is None:
        return None
    path = os.path.join(directory, LATEST_TAG_FILE)
    if not os.path.isdir(os.path.join(directory, tag)):
        raise InputError(f"{path} names {tag}, but {os.path.join(directory, tag)} does not exist (deleted or "
                         f"not copied?); restore it, or write the name of an existing global_stepN into {path}")
    return tag


def resume_tag(directory: str) -> Optional[str]:
    """The checkpoint a run resuming from `directory` finds: `latest`'s, else `latest_universal`'s (DeepSpeed's
    ds_to_universal writes only that), else the Megatron layout's iter_N or release; None when none."""
    return (latest_tag(directory) or read_latest_tag(directory, LATEST_UNIVERSAL_FILE)
            or read_latest_iteration(directory))


def checkpoint_iteration(directory: Optional[str]) -> Optional[int]:
    """The iteration of the checkpoint `directory` would resume from; None when it holds none."""
    tag = resume_tag(directory) if directory else None
    if tag is None:
        return None
    number = TAG_PATTERN.match(tag) or MEGATRON_ITER_PATTERN.fullmatch(tag)
    return int(number.group(1)) if number else 0  # Megatron's release


def _same_directory(first: str, second: Optional[str]) -> bool:
    return second is not None and os.path.realpath(first) == os.path.realpath(second)


def _why_empty(directory: str) -> str:
    if not os.path.exists(directory):
        return "it does not exist"
    if not os.path.isdir(directory):
        return "it is not a directory"
    try:
        if not os.listdir(directory):
            return "it is empty"
    except OSError as err:
        return f"it cannot be listed: {err.strerror or err}; fix its permissions"
    return f"it has no '{LATEST_TAG_FILE}' file"


def resume_directory(load: Optional[str], save: Optional[str]) -> Optional[str]:
    """The directory to resume from, or None for a fresh start (see the module docstring)."""
    if not load:
        return None
    if checkpoint_iteration(load) is not None:
        return load
    if _same_directory(load, save):
        _log.info(f"--load {load}: no checkpoint there yet ({_why_empty(load)}); it is also --save, so this run "
                  f"starts from scratch")
        return None
    save_note = f"it is not --save {save}" if save else "there is no --save"
    raise InputError(f"--load {load} holds no checkpoint ({_why_empty(load)}; {save_note}); check the path, or "
                     f"drop --load to start from scratch")


def check_no_rollback(save: Optional[str], start_iteration: int, load: Optional[str]) -> None:
    """Refuse a --save whose checkpoint is newer than this run's start: saving there would overwrite it."""
    saved = checkpoint_iteration(save)
    if saved is None or saved <= start_iteration:
        return
    start = (f"iteration {start_iteration} of --load {load}" if load and start_iteration else
             "scratch (no checkpoint loaded)")
    raise InputError(f"--save {save} holds a checkpoint of iteration {saved} ({os.path.join(save, LATEST_TAG_FILE)})"
                     f", newer than this run's start from {start}: saving would overwrite that run's checkpoints "
                     f"and roll '{LATEST_TAG_FILE}' back from {saved}; to continue it pass --load {save}, or save "
                     f"to another directory")


def check_writable_directory(save: str) -> None:
    """Create --save if needed and prove a file can be written there."""
    try:
        os.makedirs(save, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(dir=save, prefix=".write-test.", suffix=".tmp")
        os.close(descriptor)
        os.unlink(probe)
    except OSError as err:
        raise InputError(f"--save {save} is not a writable directory ({err.strerror or err}); fix its "
                         f"permissions or free its file system, or choose another --save") from err


def check_files_hold_data_only(step_dir: str) -> None:
    """No file of the checkpoint (its subdirectories included) names a type outside trust.py's allow-list."""
    for parent, _, names in sorted(os.walk(step_dir)):
        for name in sorted(names):
            manifest.require_readable(os.path.join(parent, name))
            what = trust.unsafe_type(os.path.join(parent, name)) if name.endswith(".pt") else None
            if what:
                raise trust.refusal(os.path.join(parent, name), what)


def check_checkpoint_directories(load: Optional[str], save: Optional[str], trusted: Sequence[str] = (),
                                 optimizer: bool = True) -> Optional[str]:
    """Every start-up check of --load and --save; returns the directory to resume from (None: fresh).
    `trusted`: the types --trust-checkpoint names; without `optimizer` (weights only) optimizer partitions may be missing."""
    resume = resume_directory(load, save)
    if resume:
        step_dir = os.path.join(resume, resume_tag(resume))
        with trust.trusting(trusted):
            check_files_hold_data_only(step_dir)
            read_client_state(step_dir, optimizer=optimizer)  # every file checked: its manifest, or the layout's
    if save:
        check_no_rollback(save, checkpoint_iteration(resume) or 0, resume)
        check_writable_directory(save)
    return resume
