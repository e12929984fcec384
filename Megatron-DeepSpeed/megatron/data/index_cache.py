"""On-disk cache of the GPT sample index, built once and shared by every rank and later run.

Building the index for a large corpus takes minutes and every rank needs the same arrays, so one
rank builds and saves them as .npy files and all ranks map them read-only. The files are named by
the md5 of a text that describes every parameter they depend on (Megatron-DeepSpeed's text, so
each code base finds the other's caches); that text is saved beside them as a .dsc file.
"""
import hashlib
import os

import numpy as np
import torch

from megatron.data.index_building import SampleIndex
from megatron.errors import InputError
from megatron.files.atomic import write_atomically

CACHE_DIR_NAME = "index-cache"


def index_description(data_prefix: str, split_name: str, num_samples: int, seq_length: int,
                      seed: int, splits_string: str) -> str:
    """The parameter text whose md5 names the cache files (Megatron-DeepSpeed's exact wording)."""
    return "".join(line + "\n" for line in (
        "GPT Dataset",
        "",
        f"Data prefix {data_prefix}",
        f"Dataset name {split_name}",
        f"Number of samples {num_samples}",
        f"Sequence length {seq_length}",
        f"Random seed {seed}",
        f"Split {splits_string}",
    ))


def cache_directory(data_prefix: str, data_cache_path: str | None) -> str:
    """--data-cache-path when given, else index-cache/ next to the data files."""
    if data_cache_path:
        return str(data_cache_path)
    return os.path.join(os.path.dirname(str(data_prefix)), CACHE_DIR_NAME)


class IndexCache:
    """The four files of one cached index: <md5>.dsc and <md5>_<array>.npy."""

    def __init__(self, directory: str, description: str):
        self.directory = directory
        self.description = description
        key = hashlib.md5(description.encode("utf-8")).hexdigest()
        self.description_path = os.path.join(directory, key + ".dsc")
        self.array_paths = [os.path.join(directory, f"{key}_{name}.npy")
                            for name in SampleIndex._fields]

    def is_complete(self) -> bool:
        # The .dsc is written last, so its presence with all arrays means a finished save.
        return all(os.path.isfile(path) for path in [*self.array_paths, self.description_path])

    def save(self, index: SampleIndex) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            for path, array in zip(self.array_paths, index):
                write_atomically(path, lambda stream, a=array: np.save(stream, a,
                                                                        allow_pickle=False))
            write_atomically(self.description_path,
                              lambda stream: stream.write(self.description.encode("utf-8")))
        except OSError as err:
            raise InputError(f"cannot write the GPT index cache to {self.directory} "
                             f"({err.strerror or err}); pass --data-cache-path with a writable "
                             f"directory") from err

    def load(self) -> SampleIndex:
        arrays = []
        for path in self.array_paths:
            try:
                arrays.append(np.load(path, mmap_mode="r", allow_pickle=False))
            except (OSError, ValueError) as err:
                raise InputError(f"index cache file {path} is unreadable ({err}); delete it so "
                                 f"that it is rebuilt") from err
        return SampleIndex(*arrays)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def load_or_build(cache: IndexCache, build) -> SampleIndex:
    """The cached index, built with `build()` and saved first if missing.

    Under torch.distributed every rank must call this: global rank 0 builds, all ranks meet at a
    barrier, then all load. Rank 0 reaches the barrier even when building fails, so the other
    ranks report an error instead of waiting forever."""
    failure = None
    if (not _distributed() or torch.distributed.get_rank() == 0) and not cache.is_complete():
        try:
            cache.save(build())
        except Exception as err:  # re-raised below, after the barrier
            failure = err
    if _distributed():
        torch.distributed.barrier()
    if failure is not None:
        raise failure
    if not cache.is_complete():
        raise InputError(f"global rank 0 did not leave a complete index cache in "
                         f"{cache.directory} (see its error message); all ranks must see the "
                         f"same directory: pass --data-cache-path on a shared file system")
    return cache.load()
