"""Weighted blending: Megatron's greedy interleave, item routing, and blends built from files."""
import math
import os

import numpy as np
import pytest

from tests.helpers.gpt_dataset_reference import numbered_items
from megatron.data.blendable_dataset import BlendableDataset, build_blending_indices
from megatron.data.gpt_dataset import build_train_valid_test_datasets
from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
from megatron.errors import InputError


def reference_blending(weights, size):
    """The greedy rule written out: the first dataset with the largest w * max(i, 1) - count."""
    counts = [0] * len(weights)
    dataset_index, sample_index = [], []
    for i in range(size):
        errors = [w * max(i, 1.0) - c for w, c in zip(weights, counts)]
        best = errors.index(max(errors))
        dataset_index.append(best)
        sample_index.append(counts[best])
        counts[best] += 1
    return dataset_index, sample_index


@pytest.mark.parametrize("weights, datasets, samples", [
    # i=0: errors .25, .75 -> 1; i=1 (x=1): .25, -.25 -> 0; i=2: -.5, .5 -> 1; i=3: -.25, .25 -> 1
    ([0.25, 0.75], [1, 0, 1, 1], [0, 0, 1, 2]),
    # ties go to the first dataset: i=0 (.5, .5) -> 0; i=1: -.5, .5 -> 1; i=2: 0, 0 -> 0; ...
    ([0.5, 0.5], [0, 1, 0, 1], [0, 0, 1, 1]),
])
def test_greedy_interleave_hand_computed(weights, datasets, samples):
    dataset_index, sample_index = build_blending_indices(weights, 4)
    assert dataset_index.dtype == np.uint8 and sample_index.dtype == np.int64
    assert dataset_index.tolist() == datasets
    assert sample_index.tolist() == samples


def test_greedy_interleave_equals_the_reference_rule_and_tracks_the_weights():
    rng = np.random.default_rng(1)
    for num_datasets in (1, 2, 3, 7, 12):
        raw = rng.random(num_datasets) + 0.01
        weights = raw / np.sum(raw)
        dataset_index, sample_index = build_blending_indices(weights, 3000)
        expected_datasets, expected_samples = reference_blending(weights.tolist(), 3000)
        assert dataset_index.tolist() == expected_datasets
        assert sample_index.tolist() == expected_samples
        taken = np.cumsum(np.eye(num_datasets, dtype=np.int64)[dataset_index], axis=0)
        ideal = np.outer(np.arange(1, 3001), weights)
        assert np.abs(taken - ideal).max() <= 1.0


def test_items_come_from_the_chosen_dataset():
    datasets = [[f"a{k}" for k in range(10)], [f"b{k}" for k in range(10)]]
    blend = BlendableDataset(datasets, [1, 3], 8)
    assert len(blend) == 8
    assert [blend[i] for i in range(8)] == ["b0", "a0", "b1", "b2", "a1", "b3", "b4", "b5"]


@pytest.mark.parametrize("datasets, weights, size, fragment", [
    ([[0]], [-1.0], 1, ">= 0"),
    ([[0], [1]], [1.0], 1, "one weight per dataset"),
    ([[0]] * 256, [1.0] * 256, 1, "1 to 255 datasets"),
    ([[0], [1, 2, 3]], [0.5, 0.5], 4, "has 1 samples but the blend of 4 samples needs 2"),
])
def test_bad_blends_are_input_errors(datasets, weights, size, fragment):
    with pytest.raises(InputError, match=fragment):
        BlendableDataset(datasets, weights, size)


# --------------------------------------------------------------------------------- from files

def write_corpus(prefix, sizes, first_token):
    prefix.parent.mkdir(exist_ok=True)
    with MMapIndexedDatasetBuilder(str(prefix), np.uint16) as builder:
        for tokens in numbered_items(sizes):
            builder.add_item(np.array(tokens, dtype=np.int64) + first_token)
            builder.end_document()
    return str(prefix)


def _samples_asked(cache_dir):
    """Split name -> 'Number of samples' of every description in the cache."""
    asked = {}
    for name in os.listdir(cache_dir):
        if name.endswith(".dsc"):
            lines = (cache_dir / name).read_text().splitlines()
            fields = dict(line.rsplit(" ", 1) for line in lines[2:])
            asked.setdefault(fields["Dataset name"], []).append(int(fields["Number of samples"]))
    return {split: sorted(counts) for split, counts in asked.items()}


def test_blend_from_files_asks_each_dataset_for_its_share_plus_half_a_percent(tmp_path):
    small = write_corpus(tmp_path / "a" / "small", [9, 4, 7, 5] * 3, first_token=0)
    large = write_corpus(tmp_path / "b" / "large", [6, 8, 3] * 4, first_token=30000)
    train, valid, test = build_train_valid_test_datasets(["1", small, "3", large], "10,2,0",
                                                         [100, 8, 0], 4, 5)
    assert test is None
    assert len(train) == 100 and len(valid) == 8
    # train: ceil(100 * .25 * 1.005) = 26, ceil(100 * .75 * 1.005) = 76;
    # valid: ceil(8 * .25 * 1.005) = 3, ceil(8 * .75 * 1.005) = 7
    assert _samples_asked(tmp_path / "a" / "index-cache") == {"train": [26], "valid": [3]}
    assert _samples_asked(tmp_path / "b" / "index-cache") == {"train": [76], "valid": [7]}
    assert math.isclose(train.weights[0], 0.25)
    for i in range(len(train)):
        source = train.datasets[train.dataset_index[i]]
        expected = source[int(train.dataset_sample_index[i])]["text"]
        np.testing.assert_array_equal(train[i]["text"], expected)
        assert (expected >= 30000).all() == (train.dataset_index[i] == 1)


def test_blend_with_a_split_empty_in_only_some_datasets_is_refused(tmp_path):
    big = write_corpus(tmp_path / "big", [5] * 20, first_token=0)
    tiny = write_corpus(tmp_path / "tiny", [5, 5], first_token=0)   # "9,1": valid gets 0 items
    with pytest.raises(InputError, match="valid split of .*tiny is empty"):
        build_train_valid_test_datasets(["1", big, "1", tiny], "9,1", [4, 2, 0], 3, 1)
