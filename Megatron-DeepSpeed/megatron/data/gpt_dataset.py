"""GPT training samples from Megatron .bin/.idx files: the dataset, and the train/valid/test
datasets built from --data-path, --split, the sample counts, --seq-length and --seed.

The sample order is Megatron's (index_building.py), so a run switched over from Megatron sees
the same tokens in the same order; the index arrays come from the shared cache (index_cache.py).
"""
import logging
import math
import os
import time

import numpy as np

from megatron.data.blendable_dataset import BLEND_MARGIN, BlendableDataset
from megatron.data.index_building import (SampleIndex, build_sample_index, num_epochs,
                                          num_samples_in)
from megatron.data.index_cache import IndexCache, cache_directory, index_description, load_or_build
from megatron.data.indexed_dataset import MMapIndexedDataset, data_file_path, index_file_path
from megatron.data.splits import SPLIT_NAMES, parse_split, split_boundaries
from megatron.errors import InputError

_log = logging.getLogger(__name__)


class GPTDataset:
    """Item i: {"text": int64[seq_length + 1]}, consecutive tokens of the shuffled document
    stream; its last token is also the first token of the sample that follows it in the stream."""

    def __init__(self, indexed_dataset, index: SampleIndex):
        self.indexed_dataset = indexed_dataset
        self.doc_idx, self.sample_idx, self.shuffle_idx = index

    def __len__(self):
        return len(self.sample_idx) - 1

    def __getitem__(self, index):
        sample = int(self.shuffle_idx[index])
        first_position, first_offset = (int(value) for value in self.sample_idx[sample])
        last_position, last_offset = (int(value) for value in self.sample_idx[sample + 1])
        get = self.indexed_dataset.get
        if first_position == last_position:
            tokens = get(self.doc_idx[first_position], offset=first_offset,
                         length=last_offset - first_offset + 1)
        else:
            pieces = [get(self.doc_idx[first_position], offset=first_offset)]
            pieces += [get(document) for document in self.doc_idx[first_position + 1:last_position]]
            pieces.append(get(self.doc_idx[last_position], length=last_offset + 1))
            tokens = np.concatenate(pieces)
        return {"text": np.array(tokens, dtype=np.int64)}


def build_gpt_dataset(split_name: str, data_prefix: str, indexed_dataset, documents: np.ndarray,
                      splits_string: str, num_samples: int, seq_length: int, seed: int,
                      data_cache_path: str | None = None) -> GPTDataset:
    """A GPTDataset of at least `num_samples` samples over `documents` (item indices of
    `indexed_dataset`), its index loaded from the cache or built and saved there."""
    tokens_per_epoch = int(np.sum(indexed_dataset.sizes[documents], dtype=np.int64))
    if tokens_per_epoch == 0:
        raise InputError(f"--data-path {data_prefix}: the {split_name} split ({len(documents)} "
                         f"items under --split {splits_string!r}) holds no tokens but "
                         f"{num_samples} samples are needed; give that split a larger share or "
                         f"use a dataset with non-empty documents")

    def build():
        started = time.perf_counter()
        index = build_sample_index(indexed_dataset.sizes, documents, num_samples, seq_length,
                                   seed)
        epochs = len(index.doc_idx) // len(documents)
        _log.info(f" > built {split_name} index of {data_prefix}: {len(index.shuffle_idx)} samples, "
                  f"{epochs} epochs, {time.perf_counter() - started:.2f} s")
        return index

    cache = IndexCache(cache_directory(data_prefix, data_cache_path),
                       index_description(data_prefix, split_name, num_samples, seq_length, seed,
                                         splits_string))
    index = load_or_build(cache, build)
    _check_index_fits(index, cache, tokens_per_epoch, len(documents),
                      num_epochs(tokens_per_epoch, seq_length, num_samples), seq_length)
    return GPTDataset(indexed_dataset, index)


def _check_index_fits(index, cache, tokens_per_epoch, num_documents, epochs, seq_length):
    """A cache built from older files under the same prefix would serve wrong tokens silently."""
    samples = num_samples_in(epochs, tokens_per_epoch, seq_length)
    if (len(index.doc_idx) != epochs * num_documents or len(index.shuffle_idx) != samples
            or index.sample_idx.shape != (samples + 1, 2)):
        raise InputError(f"the cached index {cache.description_path} (and its .npy files) does "
                         f"not match the current data files: they were re-created after the "
                         f"cache was built; delete those files so that the index is rebuilt")


def parse_data_prefix(data_prefix) -> tuple[list[str], list[float] | None]:
    """--data-path as (prefixes, normalised weights); weights are None for a single prefix."""
    values = [data_prefix] if isinstance(data_prefix, str) else list(data_prefix)
    example = "give one prefix, or pairs like '--data-path 0.3 corpusA_text_document 0.7 corpusB'"
    if not values:
        raise InputError(f"--data-path is empty; {example}")
    if len(values) == 1:
        return [str(values[0])], None
    if len(values) % 2:
        raise InputError(f"--data-path {' '.join(map(str, values))}: with several datasets the "
                         f"values must be weight-prefix pairs, but there are {len(values)} "
                         f"values; {example}")
    weights = []
    for raw in values[0::2]:
        try:
            weight = float(raw)
        except (TypeError, ValueError):
            raise InputError(f"--data-path weight {raw!r} is not a number; {example}") from None
        if not 0 < weight < math.inf:
            raise InputError(f"--data-path weight {raw!r} must be a positive finite number "
                             f"(remove a dataset instead of giving it weight 0); {example}")
        weights.append(weight)
    total = sum(weights)
    return [str(prefix).strip() for prefix in values[1::2]], [weight / total for weight in weights]


def _open_indexed_dataset(prefix):
    missing = [path for path in (data_file_path(prefix), index_file_path(prefix))
               if not os.path.isfile(path)]
    if missing:
        raise InputError(f"--data-path {prefix}: {' and '.join(missing)} not found; the prefix "
                         f"is the path without .bin/.idx, and tools/preprocess_data.py "
                         f"--output-prefix ... creates the files")
    return MMapIndexedDataset(prefix)


def _split_datasets(prefix, splits_string, num_samples, seq_length, seed, data_cache_path):
    """(train, valid, test) GPTDatasets of one prefix; None for an empty or unused split."""
    indexed_dataset = _open_indexed_dataset(prefix)
    boundaries = split_boundaries(splits_string, len(indexed_dataset))
    datasets = []
    for name, start, end, count in zip(SPLIT_NAMES, boundaries, boundaries[1:], num_samples):
        if end <= start or count == 0:
            datasets.append(None)
            continue
        datasets.append(build_gpt_dataset(name, prefix, indexed_dataset,
                                          np.arange(start, end, dtype=np.int32), splits_string,
                                          count, seq_length, seed, data_cache_path))
    return datasets


def _blend(split_name, datasets, prefixes, weights, size):
    present = [dataset is not None for dataset in datasets]
    if not any(present):
        return None
    if not all(present):
        empty = [prefix for prefix, here in zip(prefixes, present) if not here]
        raise InputError(f"--data-path: the {split_name} split of {', '.join(empty)} is empty "
                         f"while other datasets have one, so they cannot be blended; give that "
                         f"split a larger --split share or remove those datasets")
    return BlendableDataset(datasets, weights, size)


def build_train_valid_test_datasets(data_prefix, splits_string: str,
                                    train_valid_test_num_samples, seq_length: int, seed: int,
                                    data_cache_path: str | None = None):
    """(train, valid, test) datasets; each None when its split is empty or needs 0 samples.

    data_prefix is [prefix] or [w1, p1, w2, p2, ...]. When blending, each prefix provides
    ceil(n * w * 1.005) samples per split and the blend serves exactly n."""
    if seq_length < 1:
        raise InputError(f"--seq-length {seq_length} must be at least 1")
    num_samples = [int(count) for count in train_valid_test_num_samples]
    if len(num_samples) != len(SPLIT_NAMES) or min(num_samples) < 0:
        raise InputError(f"sample counts {num_samples} must be three numbers >= 0 (train, valid, "
                         f"test); check --train-iters/--train-samples, --eval-iters and "
                         f"--eval-interval")
    parse_split(splits_string)  # a bad --split fails before any file is opened
    prefixes, weights = parse_data_prefix(data_prefix)
    if weights is None:
        return tuple(_split_datasets(prefixes[0], splits_string, num_samples, seq_length, seed,
                                     data_cache_path))
    per_prefix = [_split_datasets(prefix, splits_string,
                                  [int(math.ceil(count * weight * BLEND_MARGIN))
                                   for count in num_samples],
                                  seq_length, seed, data_cache_path)
                  for prefix, weight in zip(prefixes, weights)]
    return tuple(_blend(name, [datasets[split] for datasets in per_prefix], prefixes, weights,
                        num_samples[split])
                 for split, name in enumerate(SPLIT_NAMES))
