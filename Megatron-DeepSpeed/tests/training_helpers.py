"""Shared by the training tests: a learnable Megatron-format dataset and a tiny model's flags."""
import numpy as np

from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder

VOCAB = 200  # NullTokenizer: eod = 200; padded to 256 at TP 1, 2 and 4 with --make-vocab-size-divisible-by 64

TINY_FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
              "--lr", "1e-2", "--min-lr", "1e-3", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
              "--hidden-dropout", "0", "--attention-dropout", "0", "--tokenizer-type", "NullTokenizer",
              "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "64", "--split", "90,10,0",
              "--num-workers", "0", "--seed", "7"]


def write_counting_dataset(prefix: str, documents: int = 400) -> str:
    """Documents that count upwards with a per-document step: easy to learn, so the loss must fall."""
    rng = np.random.default_rng(0)
    with MMapIndexedDatasetBuilder(prefix, np.uint16) as builder:
        for _ in range(documents):
            start, step, length = rng.integers(0, VOCAB), rng.integers(1, 4), rng.integers(20, 120)
            builder.add_item((start + step * np.arange(length)) % VOCAB)
            builder.end_document()
    return prefix
