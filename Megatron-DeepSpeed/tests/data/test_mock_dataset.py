"""Synthetic samples: shape, range, and tokens fixed by (seed, index) whatever the access order."""
import numpy as np
import pytest
import torch

from megatron.data.gpt_batch import collate
from megatron.data.mock_dataset import MockGPTDataset
from megatron.errors import InputError


def test_items_are_int64_arrays_of_seq_length_plus_one_within_the_vocab():
    dataset = MockGPTDataset(num_samples=50, seq_length=32, vocab_size=7, seed=1234)
    assert len(dataset) == 50
    tokens = np.stack([dataset[i]["text"] for i in range(len(dataset))])
    assert tokens.dtype == np.int64 and tokens.shape == (50, 33)
    assert tokens.min() == 0 and tokens.max() == 6  # every id of a 7-word vocab shows up


def test_an_item_depends_on_seed_and_index_only():
    forwards = MockGPTDataset(10, 16, 1000, seed=5)
    backwards = MockGPTDataset(10, 16, 1000, seed=5)
    in_order = [forwards[i]["text"] for i in range(10)]
    reversed_order = [backwards[i]["text"] for i in reversed(range(10))][::-1]
    for first, second in zip(in_order, reversed_order):
        np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(forwards[3]["text"], forwards[3]["text"])
    # The dataset's length does not change an item either.
    np.testing.assert_array_equal(MockGPTDataset(1000, 16, 1000, seed=5)[3]["text"], in_order[3])


def test_different_indices_and_seeds_give_different_tokens():
    dataset = MockGPTDataset(3, 64, 50000, seed=0)
    other_seed = MockGPTDataset(3, 64, 50000, seed=1)
    assert not np.array_equal(dataset[0]["text"], dataset[1]["text"])
    assert not np.array_equal(dataset[0]["text"], other_seed[0]["text"])


def test_numpy_and_torch_integer_indices_work():
    dataset = MockGPTDataset(4, 8, 100, seed=3)
    np.testing.assert_array_equal(dataset[np.int64(2)]["text"], dataset[2]["text"])
    np.testing.assert_array_equal(dataset[torch.tensor(2)]["text"], dataset[2]["text"])


@pytest.mark.parametrize("index", [4, -1, 100])
def test_out_of_range_index_raises_index_error(index):
    with pytest.raises(IndexError, match=f"sample {index} is outside"):
        MockGPTDataset(4, 8, 100, seed=3)[index]


def test_iteration_stops_at_the_end():
    assert len(list(MockGPTDataset(3, 2, 10, seed=0))) == 3


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_samples=-1), "num_samples -1 must be at least 0"),
    (dict(seq_length=0), "seq_length 0 must be at least 1; it comes from --seq-length"),
    (dict(vocab_size=0), "vocab_size 0 must be at least 1"),
    (dict(seed=-2), "seed -2 must be at least 0; it comes from --seed"),
])
def test_bad_sizes_are_input_errors(kwargs, message):
    arguments = {**dict(num_samples=4, seq_length=8, vocab_size=100, seed=3), **kwargs}
    with pytest.raises(InputError, match=message):
        MockGPTDataset(**arguments)


def test_feeds_a_data_loader_through_collate():
    dataset = MockGPTDataset(6, 5, 100, seed=9)
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, collate_fn=collate)
    batches = list(loader)
    assert [batch.shape for batch in batches] == [(3, 6), (3, 6)]
    assert torch.equal(batches[1][0], torch.from_numpy(dataset[3]["text"]))
