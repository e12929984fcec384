"""Stopping flags (megatron/config/flags/stopping.py): their defaults, their bounds, and the StoppingConfig."""
from megatron.config.flags import stopping
from megatron.config.job import StoppingConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults():
    assert parsed_alone(stopping) == {"max_consecutive_nan_iterations": 10, "exit_signal_handler": False,
                                      "exit_duration_in_mins": None, "distributed_timeout_minutes": 10.0}


def test_counts_and_durations_must_be_above_zero():
    assert refusal(parsed_alone, stopping, "--max-consecutive-nan-iterations", "0") == (
        "argument --max-consecutive-nan-iterations: 0 must be greater than 0 (see group --help)")
    assert "--distributed-timeout-minutes: -1 must be greater than 0" in refusal(
        parsed_alone, stopping, "--distributed-timeout-minutes", "-1")


def test_section():
    assert stopping.section(resolved("--exit-signal-handler", "--exit-duration-in-mins", "1.5")) == StoppingConfig(
        max_consecutive_nan_iterations=10, exit_signal_handler=True, exit_duration_in_mins=1.5,
        distributed_timeout_minutes=10.0)
