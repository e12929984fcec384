"""A directory path without glob characters, for libraries that glob the paths they are given.

DeepSpeed finds a checkpoint's files with glob.glob(os.path.join(load_dir, tag, pattern)) (engine
_get_all_ckpt_names, PipelineModule.ckpt_layer_path_list) but opens others by the same path directly, so
glob.escape would fix the one and break the other. A run saved under `--save 'run[lr=1e-3]'` is therefore
handed over as a link to it in a fresh temporary directory, whose path has no glob character.
"""
import contextlib
import glob
import os
import tempfile
from typing import Iterator


@contextlib.contextmanager
def glob_free(directory: str) -> Iterator[str]:
    """`directory` itself when its path has no glob character, else a link to it that lives for the block."""
    if not glob.has_magic(directory):
        yield directory
        return
    with tempfile.TemporaryDirectory(prefix="glob-free-") as holder:
        link = os.path.join(holder, "directory")
        os.symlink(os.path.abspath(directory), link)
        yield link
