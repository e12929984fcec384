"""GPT dataset items, their index from the cache, and the train/valid/test datasets from files."""
import logging
import os

import numpy as np
import pytest

from tests.helpers.gpt_dataset_reference import InMemoryIndexedDataset, numbered_items, reference_sample_idx
from megatron.data.gpt_dataset import (GPTDataset, build_gpt_dataset,
                                       build_train_valid_test_datasets, parse_data_prefix)
from megatron.data.index_building import SampleIndex, build_sample_index
from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
from megatron.errors import InputError


def test_items_follow_sample_idx_and_shuffle_idx():
    # Items 0..3 of 3, 0, 5 and 2 tokens; sample 0 = 5 tokens from (0, 0) to (2, 1) inclusive,
    # sample 1 = from (2, 1) to (3, 0); served in the order sample 1, sample 0.
    data = InMemoryIndexedDataset(numbered_items([3, 0, 5, 2]))
    index = SampleIndex(np.arange(4, dtype=np.int32),
                        np.array([[0, 0], [2, 1], [3, 0]], dtype=np.int32),
                        np.array([1, 0], dtype=np.uint32))
    dataset = GPTDataset(data, index)
    assert len(dataset) == 2
    first, second = dataset[0]["text"], dataset[1]["text"]
    assert first.dtype == np.int64 and second.dtype == np.int64
    assert first.tolist() == [2001, 2002, 2003, 2004, 3000]
    assert second.tolist() == [0, 1, 2, 2000, 2001]
    with pytest.raises(IndexError):
        dataset[2]


def _stream(data, doc_idx):
    return np.concatenate([data.items[d] for d in doc_idx])


@pytest.mark.parametrize("num_samples, seq_length", [(5, 4), (40, 4), (9, 7), (30, 1)])
def test_items_cover_every_token_of_the_document_stream_in_order(tmp_path, num_samples,
                                                                 seq_length):
    # Items 1..5 are the split; they include an empty item and one longer than a sample.
    data = InMemoryIndexedDataset(numbered_items([4, 6, 0, 13, 2, 5, 9]))
    documents = np.arange(1, 6, dtype=np.int32)
    dataset = build_gpt_dataset("train", str(tmp_path / "corpus"), data, documents, "1,0,0",
                                num_samples, seq_length, seed=3)
    assert len(dataset) >= num_samples
    by_sample = {}
    for i in range(len(dataset)):
        text = dataset[i]["text"]
        assert len(text) == seq_length + 1
        by_sample[int(dataset.shuffle_idx[i])] = text
    assert sorted(by_sample) == list(range(len(dataset)))
    joined = np.concatenate([by_sample[0]] + [by_sample[j][1:] for j in range(1, len(dataset))])
    stream = _stream(data, dataset.doc_idx)
    np.testing.assert_array_equal(joined, stream[:len(joined)])
    assert set((stream // 1000).tolist()) <= set(documents.tolist())
    np.testing.assert_array_equal(
        dataset.sample_idx, reference_sample_idx(data.sizes, dataset.doc_idx, seq_length,
                                                 len(dataset)))


def test_cached_index_of_other_data_is_refused(tmp_path):
    prefix = str(tmp_path / "corpus")
    build_gpt_dataset("train", prefix, InMemoryIndexedDataset(numbered_items([5, 5])),
                      np.arange(2, dtype=np.int32), "1", 4, 3, seed=1)
    regrown = InMemoryIndexedDataset(numbered_items([5, 9]))   # same prefix, files re-created
    with pytest.raises(InputError, match="does not match the current data files"):
        build_gpt_dataset("train", prefix, regrown, np.arange(2, dtype=np.int32), "1", 4, 3,
                          seed=1)


def test_split_without_tokens_is_an_input_error(tmp_path):
    data = InMemoryIndexedDataset([[], []])
    with pytest.raises(InputError, match="valid split .* holds no tokens but 3 samples"):
        build_gpt_dataset("valid", str(tmp_path / "c"), data, np.arange(2, dtype=np.int32),
                          "1,1", 3, 4, seed=1)


# --------------------------------------------------------------------------------- from files

ITEM_SIZES = [7, 3, 12, 0, 5, 9, 4, 6, 8, 2, 10, 6]   # item 3 is empty


def write_corpus(prefix, sizes=ITEM_SIZES):
    """Items whose tokens name their item; an empty document (no item) after item 5."""
    with MMapIndexedDatasetBuilder(str(prefix), np.uint16) as builder:
        for item, tokens in enumerate(numbered_items(sizes)):
            builder.add_item(np.array(tokens, dtype=np.int64))
            builder.end_document()
            if item == 5:
                builder.end_document()
    return str(prefix)


def test_splits_from_files_match_the_index_algorithm(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="megatron")
    prefix = write_corpus(tmp_path / "corpus_text_document")
    # 12 items, "10,1,1": train = items 0..9, valid = item 10, test = item 11.
    train, valid, test = build_train_valid_test_datasets([prefix], "10,1,1", [30, 4, 2], 5, 99)
    built = caplog.messages
    assert len(built) == 3   # one line per split built
    assert f"built train index of {prefix}: {len(train)} samples, " in built[0]
    sizes = np.array(ITEM_SIZES, dtype=np.int32)
    for dataset, (start, end), count in ((train, (0, 10), 30), (valid, (10, 11), 4),
                                         (test, (11, 12), 2)):
        assert len(dataset) >= count
        expected = build_sample_index(sizes, np.arange(start, end, dtype=np.int32), count, 5, 99)
        for cached, computed in zip((dataset.doc_idx, dataset.sample_idx, dataset.shuffle_idx),
                                    expected):
            np.testing.assert_array_equal(cached, computed)
        for i in range(len(dataset)):
            items = set((dataset[i]["text"] // 1000).tolist())
            assert items <= set(range(start, end)), (start, end, items)
    assert len(os.listdir(tmp_path / "index-cache")) == 3 * 4

    caplog.clear()
    again = build_train_valid_test_datasets([prefix], "10,1,1", [30, 4, 2], 5, 99)
    assert not any("built" in message for message in caplog.messages)
    np.testing.assert_array_equal(again[0][7]["text"], train[7]["text"])


def test_data_cache_path_is_used_when_given(tmp_path):
    prefix = write_corpus(tmp_path / "corpus")
    build_train_valid_test_datasets([prefix], "1", [3, 0, 0], 4, 1,
                                    data_cache_path=str(tmp_path / "elsewhere"))
    assert not (tmp_path / "index-cache").exists()
    assert len(os.listdir(tmp_path / "elsewhere")) == 4


def test_empty_or_unused_splits_are_none(tmp_path):
    prefix = write_corpus(tmp_path / "corpus")
    train, valid, test = build_train_valid_test_datasets([prefix], "100,0,0", [10, 5, 5], 4, 1)
    assert train is not None and valid is None and test is None
    train, valid, test = build_train_valid_test_datasets([prefix], "8,2,2", [10, 0, 5], 4, 1)
    assert valid is None and test is not None


@pytest.mark.parametrize("data_prefix, splits, seq, fragment", [
    (["{missing}"], "1", 4, "missing.bin and .*missing.idx not found.*tools/preprocess_data.py"),
    (["{corpus}"], "1", 0, "--seq-length 0 must be at least 1"),
    (["{corpus}"], "a,b", 4, "--split 'a,b': 'a' is not a number"),
    (["1", "{corpus}", "2"], "1", 4, "weight-prefix pairs, but there are 3 values"),
    (["-1", "{corpus}", "2", "{corpus}"], "1", 4, "weight '-1' must be a positive"),
    (["x", "{corpus}", "2", "{corpus}"], "1", 4, "weight 'x' is not a number"),
    (["{corpus}"], "3,1", 4, "--data-path .*corpus: the valid split .* holds no tokens"),
])
def test_bad_input_is_reported(tmp_path, data_prefix, splits, seq, fragment):
    corpus = write_corpus(tmp_path / "corpus", sizes=[4, 4, 4, 0])   # "3,1": valid = empty item
    paths = {"corpus": corpus, "missing": str(tmp_path / "missing")}
    with pytest.raises(InputError, match=fragment):
        build_train_valid_test_datasets([value.format(**paths) for value in data_prefix], splits,
                                        [5, 5, 0], seq, 1)


def test_parse_data_prefix_normalises_weights():
    assert parse_data_prefix(["only"]) == (["only"], None)
    assert parse_data_prefix(["1", " a ", 3.0, "b"]) == (["a", "b"], [0.25, 0.75])
