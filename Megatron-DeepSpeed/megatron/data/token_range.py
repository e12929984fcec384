"""Token ids against the model's vocabulary, checked once at start-up.

An id at or above the (padded) vocabulary size would fail deep inside the embedding: an IndexError on CPU,
an opaque device-side assert on a GPU, hours into a run when the bad document comes up. It is checked
before training instead. The largest id of a dataset needs one pass over its .bin; the answer is cached
beside the sample-index cache (keyed by the .bin's size and modification time), so later runs read one line.
Under torch.distributed, global rank 0 computes it and the other ranks read the cache after a barrier.
"""
import logging
import os
import time
from typing import Optional

import numpy as np
import torch

from megatron.data.index_cache import cache_directory
from megatron.data.indexed_dataset import MMapIndexedDataset, data_file_path, require_pair
from megatron.errors import InputError
from megatron.files.atomic import write_text_atomically

_log = logging.getLogger(__name__)

_CHUNK_TOKENS = 1 << 26


def _cache_path(prefix: str, data_cache_path: Optional[str]) -> str:
    return os.path.join(cache_directory(prefix, data_cache_path), f"{os.path.basename(prefix)}_max_token_id.txt")


def _fingerprint(prefix: str) -> str:
    require_pair(prefix)
    status = os.stat(data_file_path(prefix))
    return f"{status.st_size} {status.st_mtime_ns}"


def _cached(path: str, fingerprint: str) -> Optional[int]:
    try:
        with open(path, encoding="utf-8") as handle:
            stored_fingerprint, _, value = handle.read().strip().rpartition(" ")
        return int(value) if stored_fingerprint == fingerprint else None
    except (OSError, ValueError):
        return None


def scan_max_token_id(prefix: str) -> int:
    """The largest id in dataset `prefix` (-1 when it holds no token), in one chunked pass over its .bin."""
    dtype = MMapIndexedDataset(prefix).dtype  # also checks that the pair is whole
    tokens = np.memmap(data_file_path(prefix), dtype=dtype, mode="r") if os.path.getsize(data_file_path(prefix)) \
        else np.empty(0, dtype)
    started, largest = time.perf_counter(), -1
    for start in range(0, len(tokens), _CHUNK_TOKENS):
        largest = max(largest, int(tokens[start:start + _CHUNK_TOKENS].max()))
    if len(tokens) > _CHUNK_TOKENS:
        _log.info(f" > largest token id of {prefix}: {largest} ({len(tokens)} tokens, "
                  f"{time.perf_counter() - started:.1f} s; cached)")
    return largest


def max_token_id(prefix: str, data_cache_path: Optional[str] = None) -> int:
    """The largest token id of dataset `prefix`, from the cache when it describes the current .bin."""
    path, fingerprint = _cache_path(prefix, data_cache_path), _fingerprint(prefix)
    largest = _cached(path, fingerprint)
    if largest is None:
        largest = scan_max_token_id(prefix)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_text_atomically(path, f"{fingerprint} {largest}\n")
        except (OSError, InputError) as err:  # a read-only data directory only costs the next run a scan
            _log.warning(f"cannot cache the largest token id of {prefix} in {path} ({err})")
    return largest


def check_token_ids(prefixes: list[str], padded_vocab_size: int, data_cache_path: Optional[str] = None) -> None:
    """InputError naming the first dataset that holds an id >= `padded_vocab_size`."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and torch.distributed.get_rank() != 0:
        torch.distributed.barrier()  # rank 0 fills the cache first
    try:
        for prefix in prefixes:
            largest = max_token_id(prefix, data_cache_path)
            if largest >= padded_vocab_size:
                raise InputError(f"--data-path {prefix} holds token id {largest}, but the model's vocabulary has "
                                 f"{padded_vocab_size} entries (the tokenizer's, padded): the data was made with "
                                 f"another tokenizer; use that one, or re-create the data with this one "
                                 f"(tools/preprocess_data.py)")
    finally:
        if distributed and torch.distributed.get_rank() == 0:
            torch.distributed.barrier()
