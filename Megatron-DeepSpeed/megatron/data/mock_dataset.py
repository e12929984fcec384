"""Synthetic token samples for --mock-data: benchmarks and tests that need no data files.

Each item is generated from (seed, index) alone, so any sampler order, any number of data loader
workers and a resumed run all see the same tokens for the same index.
"""
import operator

import numpy as np

from megatron.errors import InputError


class MockGPTDataset:
    """num_samples items of {"text": int64[seq_length + 1]} with uniform ids in [0, vocab_size)."""

    def __init__(self, num_samples, seq_length, vocab_size, seed):
        for name, value, least, source in (
                ("num_samples", num_samples, 0, "--train-iters / --train-samples"),
                ("seq_length", seq_length, 1, "--seq-length"),
                ("vocab_size", vocab_size, 1, "--vocab-size or the tokenizer's vocabulary"),
                ("seed", seed, 0, "--seed")):
            if value < least:
                raise InputError(f"--mock-data: {name} {value} must be at least {least}; it "
                                 f"comes from {source}, fix it there")
        self.num_samples = num_samples
        self.seq_length = seq_length
        self.vocab_size = vocab_size
        self.seed = seed

    def __len__(self):
        return self.num_samples

    def __getitem__(self, index):
        index = operator.index(index)
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} is outside the mock dataset of "
                             f"{self.num_samples} samples")
        rng = np.random.default_rng([self.seed, index])
        return {"text": rng.integers(0, self.vocab_size, size=self.seq_length + 1,
                                     dtype=np.int64)}
