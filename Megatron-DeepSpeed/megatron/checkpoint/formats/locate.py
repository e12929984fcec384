"""Which checkpoint a folder's pointer files name (`latest`, `latest_universal`, Megatron's
latest_checkpointed_iteration.txt), or the one of an iteration: the directory every reader then reads. What a
pointer file holds is data, read through pointers.py."""
import os
from typing import List, Optional

from megatron.checkpoint.file_names import (ITERATION_PATTERN, LATEST_ITERATION_FILE, LATEST_TAG_FILE,
                                            LATEST_UNIVERSAL_FILE, MEGATRON_ITER_PATTERN, RELEASE, TAG_PATTERN,
                                            UNIVERSAL_DIR, megatron_iteration_dir)
from megatron.checkpoint.formats.detect import first_model_states_file, listing
from megatron.checkpoint.pointers import inside, quoted, read_pointer
from megatron.errors import InputError


def read_latest_iteration(directory: str) -> Optional[str]:
    """The Megatron checkpoint folder `directory`'s latest_checkpointed_iteration.txt names (iter_N or
    release); None when there is no such file."""
    path = os.path.join(directory, LATEST_ITERATION_FILE)
    text = read_pointer(directory, LATEST_ITERATION_FILE)
    if text is None:
        return None
    if text == RELEASE:
        return megatron_iteration_dir(0, release=True)
    if not ITERATION_PATTERN.fullmatch(text):
        raise InputError(f"{path} holds {quoted(text)}, neither an iteration number nor 'release'; write the "
                         "iteration of a complete checkpoint into it")
    inside(directory, megatron_iteration_dir(int(text)), path)
    return megatron_iteration_dir(int(text))


def checkpoint_directory(load_dir: str, iteration: Optional[int] = None, universal: bool = False) -> str:
    """The checkpoint directory to read: the one `latest` (with `universal`: `latest_universal`) names, or that
    of `iteration`; in a Megatron-layout folder the one latest_checkpointed_iteration.txt names. `load_dir` may
    also be such a directory itself."""
    if not os.path.isdir(load_dir):
        raise InputError(f"checkpoint directory {load_dir} does not exist; give the --save directory of a run")
    if not os.access(load_dir, os.R_OK | os.X_OK):
        raise InputError(f"checkpoint directory {load_dir} cannot be listed (permission denied for this user); fix "
                         f"its permissions, or point at a checkpoint this user can read")
    base = os.path.basename(os.path.normpath(load_dir))
    if iteration is None and (TAG_PATTERN.match(base) or MEGATRON_ITER_PATTERN.fullmatch(base) or base == RELEASE
                              or os.path.isdir(os.path.join(load_dir, UNIVERSAL_DIR))):
        first_model_states_file(load_dir)
        return load_dir
    if iteration is not None:
        for name in (f"global_step{iteration}", megatron_iteration_dir(iteration)):
            if os.path.isdir(os.path.join(load_dir, name)):
                return inside(load_dir, name, f"--iteration {iteration}")
        raise InputError(f"{load_dir} has no checkpoint of iteration {iteration} "
                         f"({os.path.join(load_dir, f'global_step{iteration}')} does not exist); "
                         f"it has: {', '.join(available_tags(load_dir)) or 'none'}")
    tag = read_latest_tag(load_dir, LATEST_UNIVERSAL_FILE if universal else LATEST_TAG_FILE)
    if tag is None and not universal:  # a folder of DeepSpeed's ds_to_universal, or of the Megatron layout
        tag = read_latest_tag(load_dir, LATEST_UNIVERSAL_FILE) or read_latest_iteration(load_dir)
    if tag is None:
        tags = available_tags(load_dir)
        pointer = LATEST_UNIVERSAL_FILE if universal else f"'{LATEST_TAG_FILE}' (nor {LATEST_ITERATION_FILE})"
        hint = (f"it has {', '.join(tags)} but no {pointer} file: pass --iteration N" if tags else
                f"it holds {', '.join(listing(load_dir)[:6]) or 'nothing'}; give the --save directory of a "
                "training run")
        raise InputError(f"{load_dir} is not a checkpoint directory: {hint}")
    tag_dir = os.path.join(load_dir, tag)
    if not os.path.isdir(tag_dir):
        raise InputError(f"{load_dir}'s pointer file names checkpoint '{tag}', but {tag_dir} does not exist; pass "
                         f"--iteration N for one that does ({', '.join(available_tags(load_dir)) or 'none found'})")
    return tag_dir


def read_latest_tag(directory: str, pointer: str = LATEST_TAG_FILE) -> Optional[str]:
    """The checkpoint name `directory`'s `latest` file (or `pointer`) holds; None when there is none. One that
    cannot be read, holds no name like 'global_step1000' (a name, never a path), or names a directory that
    leads outside `directory`, is an InputError naming the file (checkpoint/pointers.py)."""
    path = os.path.join(directory, pointer)
    tag = read_pointer(directory, pointer)
    if tag is None:
        return None
    if not TAG_PATTERN.fullmatch(tag):
        raise InputError(f"{path} holds {quoted(tag)}, not a checkpoint name like 'global_step1000'; write the "
                         f"name of a complete checkpoint directory into it")
    inside(directory, tag, path)
    return tag


def available_tags(load_dir: str) -> List[str]:
    tags = [name for name in os.listdir(load_dir) if (TAG_PATTERN.match(name) or MEGATRON_ITER_PATTERN.fullmatch(name))
            and os.path.isdir(os.path.join(load_dir, name))]
    return sorted(tags, key=lambda tag: int((TAG_PATTERN.match(tag) or MEGATRON_ITER_PATTERN.fullmatch(tag)).group(1)))
