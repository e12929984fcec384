"""Test material for the GPT dataset: Megatron's sample walk written as the literal, slow loop
(the oracle the vectorised code must match), and an in-memory stand-in for an indexed dataset."""
import numpy as np


def reference_sample_idx(sizes, doc_idx, seq_length, num_samples):
    """Megatron's walk: one sample at a time, document by document."""
    sample_idx = np.zeros((num_samples + 1, 2), dtype=np.int32)
    position, offset = 0, 0
    for sample in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = int(sizes[doc_idx[position]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                position += 1
                offset = 0
        sample_idx[sample] = position, offset
    return sample_idx


class InMemoryIndexedDataset:
    """The reader API GPTDataset uses (sizes, get), over a list of token lists."""

    def __init__(self, items):
        self.items = [np.asarray(item, dtype=np.int64) for item in items]
        self.sizes = np.array([len(item) for item in self.items], dtype=np.int32)
        self.get_calls = 0

    def __len__(self):
        return len(self.items)

    def get(self, idx, offset=0, length=None):
        self.get_calls += 1
        item = self.items[int(idx)]
        end = len(item) if length is None else offset + length
        assert 0 <= offset <= end <= len(item), (idx, offset, length)
        return item[offset:end]


def numbered_items(sizes):
    """Items whose tokens name their origin: token = 1000 * item + position."""
    return [[1000 * item + position for position in range(size)]
            for item, size in enumerate(sizes)]
