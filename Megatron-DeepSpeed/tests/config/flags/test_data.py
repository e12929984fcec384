"""Upstream main's --train-data-path / --valid-data-path / --test-data-path: each split read whole from its own
data. The train split so made is the one --data-path with --split 100,0,0 makes (same documents, same order)."""
import pytest

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.errors import InputError
from tests.helpers.distributed import run_on_ranks
from tests.scripts.test_upstream_scripts import train_each
from tests.helpers.training import COMMON

BASE = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "10", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "100"]


@pytest.mark.parametrize("flags, message", [
    ("--valid-data-path a", "--valid-data-path without --train-data-path"),
    ("--train-data-path a --data-path b", "drop --data-path"),
    ("--train-data-path a --mock-data", "drop --mock-data"),
    ("--train-data-path 0.5 a 0.5", "--train-data-path 0.5 a 0.5: with several datasets"),
    ("--train-data-path a --test-data-path x b", "--test-data-path weight 'x'"),
])
def test_inconsistent_split_paths_are_one_line_errors(flags, message):
    with pytest.raises(InputError, match=message):
        validate_args(parse_args(BASE + flags.split()), 1, "cpu")


def test_the_job_keeps_each_splits_data():
    job = job_config(validate_args(parse_args(BASE + "--train-data-path 1 a 2 b --test-data-path c".split()), 1,
                                   "cpu"))
    assert job.data.split_data_paths == (("1", "a", "2", "b"), (), ("c",)) and job.data.data_path == ()


@pytest.mark.full
def test_train_data_path_trains_as_data_path_with_the_whole_split(data_prefix):
    common = [*COMMON, "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3"]
    whole = common + ["--data-path", data_prefix, "--split", "100,0,0"]
    separate = common + ["--train-data-path", data_prefix, "--valid-data-path", data_prefix, "--eval-iters", "1",
                         "--eval-interval", "3"]
    (_, expected), (log, losses) = run_on_ranks(train_each, 1, [whole, separate], timeout=300)[0]
    assert losses == expected and len(losses) == 3
    assert "validation loss at iteration 3" in log
