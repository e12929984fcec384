"""The pretraining sampler: per-rank micro-batches, resume from consumed_samples, bad arguments."""
import pytest

from megatron.data.samplers import MegatronPretrainingSampler
from megatron.errors import InputError


def batches(total, consumed, mbs, rank, dp, drop_last=True):
    sampler = MegatronPretrainingSampler(total, consumed, mbs, rank, dp, drop_last)
    result = list(sampler)
    assert len(sampler) == len(result)
    return result


def test_ranks_take_their_slice_of_each_global_batch():
    # mbs 2, dp 3: global batches of 6 starting at 0; 20 samples give 3 whole steps.
    assert batches(20, 0, 2, 0, 3) == [[0, 1], [6, 7], [12, 13]]
    assert batches(20, 0, 2, 1, 3) == [[2, 3], [8, 9], [14, 15]]
    assert batches(20, 0, 2, 2, 3) == [[4, 5], [10, 11], [16, 17]]


def test_ranks_partition_every_global_batch():
    per_rank = [batches(1000, 40, 4, rank, 8) for rank in range(8)]
    for step, micro_batches in enumerate(zip(*per_rank)):
        start = 40 + step * 32
        assert sorted(sum(micro_batches, [])) == list(range(start, start + 32))


@pytest.mark.parametrize("mbs, dp", [(1, 1), (2, 3), (4, 2)])
def test_resume_continues_the_uninterrupted_stream(mbs, dp):
    total = 101
    for rank in range(dp):
        uninterrupted = batches(total, 0, mbs, rank, dp)
        for steps_done in range(len(uninterrupted)):
            resumed = batches(total, steps_done * mbs * dp, mbs, rank, dp)
            assert resumed == uninterrupted[steps_done:]


def test_incomplete_last_step_is_cut_the_same_way_unless_dropped():
    # 11 samples, mbs 2, dp 2: steps [0..3], [4..7], then the tail [8, 9, 10].
    assert batches(11, 0, 2, 0, 2, drop_last=False)[-1] == [8, 9]
    assert batches(11, 0, 2, 1, 2, drop_last=False)[-1] == [10]
    assert batches(9, 0, 2, 1, 2, drop_last=False)[-1] == []   # same number of steps per rank
    assert batches(11, 0, 2, 1, 2) == [[2, 3], [6, 7]]


@pytest.mark.parametrize("args, fragment", [
    ((0, 0, 1, 0, 1), "total_samples .* at least 1"),
    ((10, -1, 1, 0, 1), "consumed_samples is -1"),
    ((10, 10, 1, 0, 1), "consumed_samples 10 leaves nothing"),
    ((10, 0, 0, 0, 1), "micro_batch_size .* at least 1"),
    ((10, 0, 1, 0, 0), "data_parallel_size is 0"),
    ((10, 0, 1, 2, 2), "data_parallel_rank 2 must be below data_parallel_size 2"),
    ((10, 0, 1.5, 0, 1), "must be an integer"),
])
def test_bad_arguments_are_input_errors(args, fragment):
    with pytest.raises(InputError, match=fragment):
        MegatronPretrainingSampler(*args)
