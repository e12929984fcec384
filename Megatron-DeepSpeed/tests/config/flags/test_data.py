"""Data flags (megatron/config/flags/data.py): defaults, the refusals of --data-path, --mock-data and --split, the
DataConfig; and upstream main's --train-data-path / --valid-data-path / --test-data-path: each split read whole from
its own data. The train split so made is the one --data-path with --split 100,0,0 makes (same documents, same
order)."""
import pytest

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.flags import data
from megatron.config.job import DataConfig
from megatron.errors import InputError
from tests.helpers.flag_groups import parsed_alone, refusal, resolved
from tests.helpers.distributed import run_on_ranks
from tests.scripts.test_upstream_scripts import train_each
from tests.helpers.training import COMMON

BASE = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "10", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "100"]


def test_defaults():
    values = parsed_alone(data)
    assert (values["data_path"], values["split"], values["num_workers"], values["data_impl"]) == (
        None, None, 2, "infer")
    assert data.after_parse(values) == {"dataloader_type": "single"}
    assert data.after_parse({"dataloader_type": "cyclic"}) == {"dataloader_type": "cyclic"}


@pytest.mark.parametrize("changed, message", [
    ({"data_path": ["a"]}, "--mock-data and --data-path a were both given; drop one (--mock-data trains on synthetic "
                           "tokens)"),
    ({"mock_data": False, "data_path": None}, "--data-path is required: give a .bin/.idx prefix or 'weight prefix' "
                                              "pairs, or pass --mock-data to train on synthetic tokens"),
    ({"mock_data": False, "data_path": ["0.3", "a", "0.7"]}, "--data-path 0.3 a 0.7: with several datasets give "
                                                             "'weight prefix' pairs, but there are 3 values"),
    ({"mock_data": False, "data_path": ["0", "a", "1", "b"]}, "--data-path weight '0' is not a positive number; "
                                                              "write pairs like '--data-path 0.3 prefixA 0.7 "
                                                              "prefixB'"),
    ({"split": "90,x"}, "--split '90,x' must be up to three non-negative numbers (train,valid,test) with a positive "
                        "sum, e.g. '949,50,1'"),
    ({"split": "0,0,0"}, "--split '0,0,0' must be up to three"),
    ({"split": "1,1,1,1"}, "--split '1,1,1,1' must be up to three"),
])
def test_refusals(changed, message):
    assert refusal(data.validate, {**resolved(), **changed}).startswith(message)


def test_weighted_pairs_and_a_slashed_split_pass():
    data.validate({**resolved(), "mock_data": False, "data_path": ["0.3", "a", "0.7", "b"], "split": "98/2/0"})


def test_section():
    assert data.section(resolved("--split", "90,10,0")) == DataConfig(
        data_path=(), split_data_paths=(), split="90,10,0", mock_data=True, data_cache_path=None, num_workers=2,
        seq_length=16, seed=1234, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        dataloader_type="single")


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
