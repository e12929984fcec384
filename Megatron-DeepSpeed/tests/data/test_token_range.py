"""Data checked against the model before training: token ids within the vocabulary (the largest id cached),
and a train split that is not empty."""
import os

import numpy as np
import pytest
from tests.helpers.training import TINY_FLAGS

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.data.data_loaders import build_datasets
from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
from megatron.data.token_range import check_token_ids, max_token_id
from megatron.errors import InputError


def write_dataset(prefix, documents):
    with MMapIndexedDatasetBuilder(prefix, np.uint16) as builder:
        for document in documents:
            builder.add_item(document)
            builder.end_document()
    return str(prefix)


def test_an_id_beyond_the_vocabulary_is_named_with_both_numbers(tmp_path):
    good = write_dataset(tmp_path / "good", [[1, 2, 255]] * 3)
    bad = write_dataset(tmp_path / "bad", [[1, 2, 3], [4, 300, 5]])
    check_token_ids([good], 256)
    with pytest.raises(InputError, match=f"--data-path {bad} holds token id 300, but the model's vocabulary has "
                                         f"256 entries"):
        check_token_ids([good, bad], 256)


def test_the_largest_id_is_cached_until_the_data_changes(tmp_path):
    prefix = write_dataset(tmp_path / "corpus", [[7, 9]])
    assert max_token_id(prefix) == 9
    (cache,) = os.listdir(tmp_path / "index-cache")
    fingerprint = (tmp_path / "index-cache" / cache).read_text().rsplit(" ", 1)[0]
    (tmp_path / "index-cache" / cache).write_text(f"{fingerprint} 42\n")
    assert max_token_id(prefix) == 42  # read from the cache, not the data
    write_dataset(tmp_path / "corpus", [[7, 9, 11, 12]])
    assert max_token_id(prefix) == 12  # new data, new scan


@pytest.mark.parametrize("documents, split", [([], "90,10,0"), ([[1, 2, 3]] * 20, "0,1,0")],
                         ids=["no-items", "no-train-share"])
def test_an_empty_train_split_is_an_input_error(documents, split, tmp_path):
    prefix = write_dataset(tmp_path / "corpus", documents)
    args = validate_args(parse_args([*TINY_FLAGS, "--split", split, "--data-path", prefix, "--micro-batch-size", "2",
                                     "--train-iters", "2", "--eval-iters", "0"]), 1, "cpu")
    with pytest.raises(InputError, match=f"the train split is empty \\({prefix} has {len(documents)} items; "
                                         f"--split '{split}'\\)"):
        build_datasets(job_config(args), 256)
