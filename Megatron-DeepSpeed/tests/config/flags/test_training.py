"""Training flags (megatron/config/flags/training.py): the default global batch and micro-batches per step, the
batch-size ramp-up, their refusals, and the BatchConfig."""
import pytest

from megatron.config.flags import training
from megatron.config.job import BatchConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults():
    assert parsed_alone(training) == {"micro_batch_size": None, "global_batch_size": None,
                                      "rampup_batch_size": None, "seed": None, "exit_interval": None}


def test_the_global_batch_defaults_to_one_micro_batch_per_data_parallel_rank():
    assert training.batch_sizes({**resolved(world_size=2), "global_batch_size": None}) == {
        "global_batch_size": 4, "num_micro_batches": 1}
    assert training.batch_sizes({**resolved(world_size=2), "global_batch_size": 12}) == {
        "global_batch_size": 12, "num_micro_batches": 3}


def test_a_global_batch_the_micro_batches_do_not_divide_suggests_two():
    assert refusal(training.batch_sizes, {**resolved(world_size=2), "global_batch_size": 10}) == (
        "--global-batch-size 10 is not divisible by --micro-batch-size 2 x data parallel size 2 (world size 2 / "
        "(TP 1 x PP 1)) = 4; use a multiple of 4, e.g. 8 or 12")


def samples_run(*rampup, **changed) -> dict:
    return {**resolved("--global-batch-size", "16"), "train_iters": None, "train_samples": 1000,
            "rampup_batch_size": list(rampup), **changed}


def test_the_rampup_as_three_whole_numbers():
    assert training.rampup(samples_run("4", "4", "100")) == {"rampup_batch_size": [4, 4, 100]}
    assert training.rampup(resolved()) == {}


@pytest.mark.parametrize("rampup, changed, message", [
    (("4", "4"), {}, "--rampup-batch-size 4 4: give three numbers, START INCREMENT SAMPLES"),
    (("4", "x", "1"), {}, "--rampup-batch-size 4 x 1: START INCREMENT SAMPLES must be whole numbers"),
    (("4", "4", "100"), {"train_iters": 10, "train_samples": None}, "--rampup-batch-size counts samples; give the "
                                                                    "training length as --train-samples"),
    (("0", "4", "100"), {}, "--rampup-batch-size 0 4 100: START and INCREMENT must be positive"),
    (("4", "8", "100"), {}, "--rampup-batch-size 4 8 100 must reach --global-batch-size 16 in whole increments"),
    (("6", "2", "100"), {"micro_batch_size": 4}, "--rampup-batch-size START 6 is not a multiple of "
                                                 "--micro-batch-size 4 x data parallel size 1 = 4"),
])
def test_rampup_refusals(rampup, changed, message):
    assert refusal(training.rampup, samples_run(*rampup, **changed)).startswith(message)


def test_section():
    assert training.section(resolved("--global-batch-size", "8")) == BatchConfig(
        micro_batch_size=2, global_batch_size=8, num_micro_batches=4, rampup=None)
