"""Several datasets served as one, each in proportion to its weight (--data-path w1 p1 w2 p2 ...).

Megatron interleaves greedily: sample i comes from the dataset that is furthest behind its share
at that point, so every prefix of the blend has the right mix, not just the whole. The order is
part of what users compare across code bases, so the rule and its float arithmetic are Megatron's.
"""
import math

import numpy as np

from megatron.errors import InputError

MAX_DATASETS = 255  # dataset_index is uint8
# Each blended dataset is built for this much more than its share (Megatron's margin).
BLEND_MARGIN = 1.005


def build_blending_indices(weights, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index uint8[size], dataset_sample_index int64[size]) of the greedy interleave:
    sample i comes from the first dataset d maximising weights[d] * max(i, 1) - count[d], and is
    that dataset's count[d]-th sample. `weights` are normalised floats."""
    weights = [float(weight) for weight in weights]
    counts = [0] * len(weights)
    others = range(1, len(weights))
    choices = bytearray(size)
    # One pass per sample is inherently sequential; plain floats and lists keep it near
    # 0.2 us per sample for two datasets.
    for i in range(size):
        progress = float(i or 1)
        best, best_error = 0, weights[0] * progress - counts[0]
        for d in others:
            error = weights[d] * progress - counts[d]
            if error > best_error:
                best, best_error = d, error
        choices[i] = best
        counts[best] += 1
    dataset_index = np.frombuffer(choices, dtype=np.uint8).copy()
    return dataset_index, _rank_within_dataset(dataset_index, len(weights))


def _rank_within_dataset(dataset_index, num_datasets):
    """For each position, how many earlier positions chose the same dataset."""
    order = np.argsort(dataset_index, kind="stable")
    per_dataset = np.bincount(dataset_index, minlength=num_datasets)
    first_in_order = np.repeat(np.cumsum(per_dataset) - per_dataset, per_dataset)
    ranks = np.empty(len(dataset_index), dtype=np.int64)
    ranks[order] = np.arange(len(dataset_index), dtype=np.int64) - first_in_order
    return ranks


def _normalised_weights(weights, num_datasets):
    if len(weights) != num_datasets:
        raise InputError(f"blending needs one weight per dataset: got {len(weights)} weights "
                         f"for {num_datasets} datasets")
    values = np.array([float(weight) for weight in weights], dtype=np.float64)
    if not np.all(np.isfinite(values)) or np.any(values < 0) or values.max() <= 0:
        raise InputError(f"blending weights {list(weights)} must be finite, >= 0 and not all "
                         f"0; fix the weights in --data-path")
    relative = values / values.max()  # their sum cannot overflow (1e308 and 1e308 are equal weights)
    return relative / relative.sum()


class BlendableDataset:
    """Item i is item dataset_sample_index[i] of datasets[dataset_index[i]]."""

    def __init__(self, datasets, weights, size: int):
        self.datasets = list(datasets)
        if not 1 <= len(self.datasets) <= MAX_DATASETS:
            raise InputError(f"blending takes 1 to {MAX_DATASETS} datasets, got "
                             f"{len(self.datasets)}; merge some with tools/merge_datasets.py")
        if size < 0:
            raise InputError(f"a blended dataset cannot have {size} samples")
        self.weights = _normalised_weights(weights, len(self.datasets))
        self.size = size
        self.dataset_index, self.dataset_sample_index = build_blending_indices(self.weights, size)
        needed = np.bincount(self.dataset_index, minlength=len(self.datasets))
        for d, (dataset, count) in enumerate(zip(self.datasets, needed)):
            if count > len(dataset):
                raise InputError(f"blended dataset {d} (weight {self.weights[d]:.4g}) has "
                                 f"{len(dataset)} samples but the blend of {size} samples "
                                 f"needs {count} from it; build it for at least "
                                 f"{math.ceil(size * self.weights[d] * BLEND_MARGIN)} samples")

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        dataset = self.datasets[self.dataset_index[index]]
        return dataset[int(self.dataset_sample_index[index])]
