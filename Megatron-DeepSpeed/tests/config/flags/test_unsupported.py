"""Upstream flags not supported here (megatron/config/flags/unsupported.py): accepted at values that leave their
feature off and then dropped from the values; a value that turns a feature on, or a flag upstream removed, is one
line naming the flag and the feature (or the flag to use instead)."""
import pytest

from megatron.config.flags import unsupported
from tests.helpers.flag_groups import parsed_alone, refusal

SHAPE = {"num_attention_heads": 4, "hidden_size": 32}


def values_with(*argv) -> dict:
    return {**parsed_alone(unsupported, *argv), **SHAPE}


def test_their_defaults_are_accepted_and_dropped():
    assert unsupported.supported({**values_with(), "lr": 0.1}) == {**SHAPE, "lr": 0.1}


def test_knobs_alone_turn_nothing_on():
    assert "kd_temp" not in unsupported.supported(values_with("--kd-temp", "2.0", "--tile-factor", "4"))


@pytest.mark.parametrize("argv, message", [
    (["--kd"], "--kd: Megatron-DeepSpeed's knowledge distillation is not supported by this trainer"),
    (["--num-layers-per-virtual-pipeline-stage", "2"],
     "--num-layers-per-virtual-pipeline-stage: Megatron-DeepSpeed's interleaved (virtual) pipeline schedule is not "
     "supported by this trainer"),
    (["--batch-size", "4"], "--batch-size: Megatron-DeepSpeed itself no longer accepts it; use --micro-batch-size"),
])
def test_a_value_that_turns_a_feature_on_is_one_line(argv, message):
    assert refusal(unsupported.supported, values_with(*argv)) == message


def test_every_entry_has_a_destination_and_a_default_argparse_agrees_with():
    parsed = parsed_alone(unsupported)
    assert {entry.dest: entry.default for entry in unsupported.UNSUPPORTED_FLAGS} == parsed
