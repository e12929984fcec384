"""The loaders of a run (megatron/data/data_loaders.py): the samples each split must provide (Megatron's
arithmetic), the datasets of --mock-data, of --data-path with --split and of per-split paths, an empty train split
as one line, and micro-batches for one data-parallel rank that resume after the consumed samples; pre-training's data
source refuses --pack-sequences in one line."""
import pytest
import torch

from megatron.config.arguments import build_job_config, job_config, parse_args, resolve, validate_args
from megatron.data.data_loaders import PretrainingData, build_data_loader, build_datasets, train_valid_test_num_samples
from megatron.errors import InputError
from tests.helpers.flag_groups import VALID, resolved
from tests.helpers.training import VOCAB, write_counting_dataset


RUN = ["--global-batch-size", "4", "--eval-interval", "4", "--eval-iters", "2"]  # 10 iterations (VALID)


def job(*argv):
    return build_job_config(resolved(*RUN, *argv))


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    return write_counting_dataset(str(tmp_path_factory.mktemp("data") / "counting_text_document"), documents=60)


def job_on_disk(*argv):
    """The job of VALID's flags without --mock-data, with RUN's and argv."""
    flags = [flag for flag in VALID if flag != "--mock-data"] + [*RUN, "--vocab-size", str(VOCAB), *argv]
    return build_job_config(resolve(vars(parse_args(flags)), 1, "cpu"))


def test_samples_per_split():
    # train 10 x 4; validation (10 // 4 + 1) evaluations x 2 iterations x 4; test 2 x 4
    assert train_valid_test_num_samples(job()) == [40, 24, 8]


def test_mock_data_gives_each_used_split_its_samples():
    train, valid, test = build_datasets(job(), vocab_size=128)
    assert (len(train), len(valid), len(test)) == (40, 24, 8)
    assert build_datasets(job("--eval-iters", "0"), vocab_size=128)[1:] == (None, None)


def test_files_split_by_the_split_flag(prefix):
    train, valid, test = build_datasets(job_on_disk("--data-path", prefix, "--split", "80,20,0"),
                                        vocab_size=VOCAB)
    assert len(train) >= 40 and len(valid) >= 24 and test is None
    assert train[0]["text"].shape == (17,)  # --seq-length 16, plus the next token


def test_an_empty_train_split_is_one_line(prefix):
    with pytest.raises(InputError) as error:
        build_datasets(job_on_disk("--data-path", prefix, "--split", "0,100,0"), vocab_size=VOCAB)
    assert str(error.value).startswith(f"--data-path: the train split is empty ({prefix} has 60 items; --split "
                                       "'0,100,0')")


def test_per_split_paths_read_each_whole(prefix):
    train, valid, test = build_datasets(job_on_disk("--train-data-path", prefix, "--test-data-path", prefix),
                                        vocab_size=VOCAB)
    assert valid is None and len(train) >= 40 and len(test) >= 8


def test_micro_batches_of_one_rank_resume_after_the_consumed_samples():
    dataset = build_datasets(job(), vocab_size=128)[0]
    loader = build_data_loader(dataset, 0, micro_batch_size=2, num_workers=0, data_parallel_rank=1,
                               data_parallel_size=2)
    batches = list(loader)
    assert len(batches) == 10 and batches[0].shape == (2, 17) and batches[0].dtype == torch.int64
    expected = torch.stack([torch.from_numpy(dataset[index]["text"]).long() for index in (2, 3)])
    assert torch.equal(batches[0], expected)  # rank 1 of 2 takes the second pair of each step of 4
    resumed = build_data_loader(dataset, 8, micro_batch_size=2, num_workers=0, data_parallel_rank=1,
                                data_parallel_size=2)
    assert [batch.tolist() for batch in resumed] == [batch.tolist() for batch in batches[2:]]
    assert build_data_loader(None, 0, micro_batch_size=2, num_workers=0, data_parallel_rank=0,
                             data_parallel_size=1) is None


def test_pre_training_refuses_pack_sequences_in_one_line():
    argv = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
            "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "2", "--mock-data", "--tokenizer-type",
            "NullTokenizer", "--vocab-size", "100"]
    assert PretrainingData().datasets(job_config(validate_args(parse_args(argv), 1, "cpu")), None, 128)[0] is not None
    packing = job_config(validate_args(parse_args(argv + ["--pack-sequences"]), 1, "cpu"))
    with pytest.raises(InputError, match=r"^--pack-sequences packs fine-tuning examples \(finetune_llama.py\)"):
        PretrainingData().datasets(packing, None, 128)
