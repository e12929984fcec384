"""Megatron's GPT sample order: epochs, doc/sample/shuffle index arrays (the split rounding: test_splits.py)."""
import numpy as np
import pytest

from tests.helpers.gpt_dataset_reference import reference_sample_idx
from megatron.data.index_building import (
    build_doc_idx, build_sample_idx, build_sample_index, build_shuffle_idx, num_epochs,
    separate_last_epoch, shuffle_idx_dtype)


# ------------------------------------------------------------------------------------ epochs

def test_num_epochs_hand_computed():
    # 10 tokens per epoch, seq 4: one epoch gives (10 - 1) // 4 = 2 samples, two give 4.
    assert num_epochs(10, 4, 2) == 1
    assert num_epochs(10, 4, 3) == 2
    assert num_epochs(10, 4, 4) == 2
    assert num_epochs(10, 4, 5) == 3
    assert num_epochs(10, 4, 0) == 1


def test_num_epochs_matches_megatrons_loop():
    for tokens in (1, 2, 7, 10, 64):
        for seq in (1, 3, 8):
            for samples in range(0, 40):
                epochs = 0
                while True:
                    epochs += 1
                    if (epochs * tokens - 1) // seq >= samples:
                        break
                assert num_epochs(tokens, seq, samples) == epochs


def test_separate_last_epoch_flips_at_80_percent():
    # 10 tokens, seq 1: 9 samples per epoch, threshold int(0.8 * 9) = 7. Two epochs are needed
    # for 10..19 samples, of which the first epoch yields 9.
    assert separate_last_epoch(10, 1, 15, 2)       # 6 from the last epoch < 7
    assert not separate_last_epoch(10, 1, 16, 2)   # 7 from the last epoch is not < 7
    assert not separate_last_epoch(10, 1, 5, 1)    # a single epoch is never separate


# ------------------------------------------------------------------------------------ doc_idx

def test_doc_idx_without_separate_last_epoch_is_one_shuffle_of_the_tiled_documents():
    documents = np.arange(3, 8)
    doc_idx = build_doc_idx(documents, 3, np.random.RandomState(5), separate_last=False)
    assert doc_idx.dtype == np.int32
    assert sorted(doc_idx.tolist()) == sorted(list(range(3, 8)) * 3)
    expected = np.tile(np.arange(3, 8), 3)
    np.random.RandomState(5).shuffle(expected)   # the one permutation numpy defines
    np.testing.assert_array_equal(doc_idx, expected)


def test_doc_idx_with_separate_last_epoch_shuffles_the_last_epoch_apart():
    documents = np.arange(10, 30)
    doc_idx = build_doc_idx(documents, 3, np.random.RandomState(11), separate_last=True)
    assert len(doc_idx) == 60
    assert sorted(doc_idx[:40].tolist()) == sorted(list(range(10, 30)) * 2)
    assert sorted(doc_idx[40:].tolist()) == list(range(10, 30))
    rng = np.random.RandomState(11)                # same generator, earlier epochs first
    earlier, last = np.tile(documents, 2), documents.copy()
    rng.shuffle(earlier)
    rng.shuffle(last)
    np.testing.assert_array_equal(doc_idx, np.concatenate((earlier, last)))


# ------------------------------------------------------------------------------------ sample_idx

@pytest.mark.parametrize("sizes, seq, expected", [
    # Sample 1 skips the empty document and starts inside document 2; sample 2 ends exactly on
    # the first token of document 3.
    ([3, 0, 5, 2], 4, [[0, 0], [2, 1], [3, 0]]),
    # Sample 0 ends exactly at the end of document 0: sample 1 starts on its last token.
    ([5, 4], 4, [[0, 0], [0, 4], [1, 3]]),
    # A document longer than a sample holds several sample starts.
    ([11], 4, [[0, 0], [0, 4], [0, 8]]),
    # Sample 0 starts at (0, 0) even though document 0 is empty.
    ([0, 6], 2, [[0, 0], [1, 2], [1, 4]]),
    ([2, 2, 2], 1, [[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]]),
])
def test_sample_idx_hand_computed(sizes, seq, expected):
    sizes = np.array(sizes, dtype=np.int32)
    doc_idx = np.arange(len(sizes), dtype=np.int32)
    num_samples = (int(sizes.sum()) - 1) // seq
    sample_idx = build_sample_idx(sizes, doc_idx, seq, num_samples)
    assert sample_idx.dtype == np.int32
    assert sample_idx.tolist() == expected
    np.testing.assert_array_equal(sample_idx, reference_sample_idx(sizes, doc_idx, seq,
                                                                    num_samples))


def test_sample_idx_equals_the_reference_walk_on_random_data():
    rng = np.random.default_rng(0)
    for case in range(300):
        num_items = int(rng.integers(1, 12))
        seq = int(rng.integers(1, 12))
        sizes = rng.integers(0, 3 * seq + 2, size=num_items).astype(np.int32)
        sizes[rng.random(num_items) < 0.25] = 0                      # empty documents
        if case % 3 == 0:
            sizes[rng.integers(num_items)] = seq + 1                 # exact document ends
        if sizes.sum() == 0:
            sizes[-1] = 1
        epochs = int(rng.integers(1, 4))
        doc_idx = np.tile(np.arange(num_items, dtype=np.int32), epochs)
        rng.shuffle(doc_idx)
        num_samples = (epochs * int(sizes.sum()) - 1) // seq
        np.testing.assert_array_equal(
            build_sample_idx(sizes, doc_idx, seq, num_samples),
            reference_sample_idx(sizes, doc_idx, seq, num_samples),
            err_msg=f"case {case}: sizes {sizes.tolist()} seq {seq} doc_idx {doc_idx.tolist()}")


# ------------------------------------------------------------------------------------ shuffle_idx

def test_shuffle_idx_dtype_switches_two_short_of_the_uint32_limit():
    assert shuffle_idx_dtype(2**32 - 3) is np.uint32
    assert shuffle_idx_dtype(2**32 - 2) is np.int64


def test_shuffle_idx_keeps_the_last_epoch_samples_last():
    shuffle_idx = build_shuffle_idx(6, 10, np.random.RandomState(3))
    assert shuffle_idx.dtype == np.uint32
    assert sorted(shuffle_idx[:6].tolist()) == list(range(6))
    assert sorted(shuffle_idx[6:].tolist()) == [6, 7, 8, 9]


# ------------------------------------------------------------------------------------ all three

def _megatron_order(seed, documents, epochs, separate, first, total):
    """The expected draws of the one RandomState: doc shuffles, then sample shuffles."""
    rng = np.random.RandomState(seed)
    parts = [np.tile(documents, epochs - 1), documents.copy()] if separate else \
        [np.tile(documents, epochs)]
    for part in parts:
        rng.shuffle(part)
    shuffles = [np.arange(first), np.arange(first, total)] if first < total else \
        [np.arange(total)]
    for part in shuffles:
        rng.shuffle(part)
    return np.concatenate(parts), np.concatenate(shuffles)


@pytest.mark.parametrize("num_samples, separate", [(15, True), (16, False)])
def test_full_index_draws_one_generator_in_megatrons_order(num_samples, separate):
    # Items 2..4 of a dataset, 10 tokens per epoch, seq 1: two epochs give 19 samples, the first
    # one 9. 15 samples leave 6 (< 7) to the last epoch: it is separate; 16 leave 7: it is not.
    sizes = np.array([50, 50, 4, 3, 3, 50], dtype=np.int32)
    documents = np.arange(2, 5, dtype=np.int32)
    index = build_sample_index(sizes, documents, num_samples, seq_length=1, seed=1234)
    expected_docs, expected_shuffle = _megatron_order(1234, documents, 2, separate,
                                                      9 if separate else 19, 19)
    np.testing.assert_array_equal(index.doc_idx, expected_docs)
    np.testing.assert_array_equal(index.shuffle_idx, expected_shuffle)
    assert index.shuffle_idx.dtype == np.uint32
    assert index.sample_idx.shape == (20, 2)
    np.testing.assert_array_equal(index.sample_idx,
                                  reference_sample_idx(sizes, index.doc_idx, 1, 19))
    if separate:
        assert sorted(index.doc_idx[3:].tolist()) == [2, 3, 4]
        assert sorted(index.shuffle_idx[9:].tolist()) == list(range(9, 19))


def test_full_index_single_epoch_has_no_second_shuffle():
    sizes = np.array([4, 3, 3], dtype=np.int32)
    index = build_sample_index(sizes, np.arange(3, dtype=np.int32), 3, seq_length=3, seed=7)
    expected_docs, expected_shuffle = _megatron_order(7, np.arange(3, dtype=np.int32), 1, False,
                                                      3, 3)
    np.testing.assert_array_equal(index.doc_idx, expected_docs)
    np.testing.assert_array_equal(index.shuffle_idx, expected_shuffle)
    assert len(index.shuffle_idx) == (10 - 1) // 3
