"""Megatron's GPT sample order: which tokens make up sample i of a split.

Three arrays describe the order (docs/ARCHITECTURE.md, Data formats):
  doc_idx      the split's documents, repeated once per epoch and shuffled;
  sample_idx   [n + 1, 2]: where sample j starts, as (position in doc_idx, token offset). Sample j
               runs to the start of sample j + 1 inclusive, so neighbours share a boundary token;
  shuffle_idx  the order in which the n samples are served.
They must equal Megatron's arrays exactly, so that runs can move between the two code bases and be
compared. All randomness comes from one numpy RandomState(seed) drawn in a fixed order: the order
of the shuffles below is part of the format.
"""
from typing import NamedTuple

import numpy as np

# Below this fraction of an epoch, the samples taken from the last epoch are shuffled on their
# own and served last, instead of a sliver of documents being spread over the whole run.
SEPARATE_LAST_EPOCH_FRACTION = 0.80


class SampleIndex(NamedTuple):
    doc_idx: np.ndarray
    sample_idx: np.ndarray
    shuffle_idx: np.ndarray


def num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Smallest e >= 1 with (e * tokens_per_epoch - 1) // seq_length >= num_samples: n samples
    need n * seq_length + 1 tokens because neighbours share one token. tokens_per_epoch > 0."""
    tokens_needed = num_samples * seq_length + 1
    return max(1, -(-tokens_needed // tokens_per_epoch))


def num_samples_in(epochs: int, tokens_per_epoch: int, seq_length: int) -> int:
    """How many whole samples `epochs` passes over the data yield."""
    return (epochs * tokens_per_epoch - 1) // seq_length


def separate_last_epoch(tokens_per_epoch: int, seq_length: int, num_samples: int,
                        epochs: int) -> bool:
    """Whether the last epoch is used so little that it gets its own doc and sample shuffles."""
    if epochs == 1:
        return False
    from_earlier_epochs = num_samples_in(epochs - 1, tokens_per_epoch, seq_length)
    from_last_epoch = num_samples - from_earlier_epochs
    per_epoch = num_samples_in(1, tokens_per_epoch, seq_length)
    return from_last_epoch < int(SEPARATE_LAST_EPOCH_FRACTION * per_epoch)


def build_doc_idx(documents: np.ndarray, epochs: int, rng: np.random.RandomState,
                  separate_last: bool) -> np.ndarray:
    """int32 document order: `documents` tiled `epochs` times and shuffled; with separate_last,
    the first epochs - 1 copies and the last copy are shuffled apart, in that order."""
    if separate_last:
        earlier = build_doc_idx(documents, epochs - 1, rng, separate_last=False)
        last = build_doc_idx(documents, 1, rng, separate_last=False)
        return np.concatenate((earlier, last))
    doc_idx = np.tile(np.asarray(documents, dtype=np.int32), epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int,
                     num_samples: int) -> np.ndarray:
    """int32 [num_samples + 1, 2] sample starts, vectorised.

    Megatron walks the documents sample by sample; the walk puts the start of sample j >= 1 on
    token j * seq_length of the concatenated doc_idx stream, inside the one non-empty document
    that contains it (a sample ending exactly at a document's end starts the next sample on that
    document's last token). Sample 0 starts at (0, 0) even when that document is empty."""
    doc_sizes = sizes[doc_idx]
    doc_ends = np.cumsum(doc_sizes, dtype=np.int64)
    start_tokens = np.arange(1, num_samples + 1, dtype=np.int64) * seq_length
    positions = np.searchsorted(doc_ends, start_tokens, side="right")
    sample_idx = np.zeros((num_samples + 1, 2), dtype=np.int32)
    sample_idx[1:, 0] = positions
    sample_idx[1:, 1] = start_tokens - (doc_ends[positions] - doc_sizes[positions])
    return sample_idx


def shuffle_idx_dtype(num_samples: int) -> type:
    """uint32 halves the file; Megatron switches to int64 two short of the uint32 limit."""
    return np.uint32 if num_samples < np.iinfo(np.uint32).max - 1 else np.int64


def build_shuffle_idx(num_shuffled_first: int, num_samples: int,
                      rng: np.random.RandomState) -> np.ndarray:
    """Samples [0, num_shuffled_first) shuffled, then [num_shuffled_first, num_samples) shuffled
    on their own. uint32 unless the count needs more (then int64)."""
    dtype = shuffle_idx_dtype(num_samples)
    first = np.arange(num_shuffled_first, dtype=dtype)
    rng.shuffle(first)
    if num_shuffled_first == num_samples:
        return first
    rest = np.arange(num_shuffled_first, num_samples, dtype=dtype)
    rng.shuffle(rest)
    return np.concatenate((first, rest))


def build_sample_index(sizes: np.ndarray, documents: np.ndarray, num_samples: int,
                       seq_length: int, seed: int) -> SampleIndex:
    """The three arrays for at least `num_samples` samples of `documents` (item indices whose
    token counts are sizes[documents]; they must hold at least one token)."""
    tokens_per_epoch = int(np.sum(sizes[documents], dtype=np.int64))
    epochs = num_epochs(tokens_per_epoch, seq_length, num_samples)
    rng = np.random.RandomState(seed)
    separate = separate_last_epoch(tokens_per_epoch, seq_length, num_samples, epochs)
    doc_idx = build_doc_idx(documents, epochs, rng, separate)
    total_samples = num_samples_in(epochs, tokens_per_epoch, seq_length)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, total_samples)
    shuffled_first = (num_samples_in(epochs - 1, tokens_per_epoch, seq_length) if separate
                      else total_samples)
    shuffle_idx = build_shuffle_idx(shuffled_first, total_samples, rng)
    return SampleIndex(doc_idx, sample_idx, shuffle_idx)
