"""What the training loop reports (megatron/training/metrics_log.py): the --timing-log-level timers and the
TensorBoard options the logging flags choose. The lines themselves, on whole runs: test_pretrain.py,
test_log_lines.py."""
import time

import pytest

from megatron.config.flags import logging_flags
from megatron.training.metrics_log import StepTimers, tensorboard_options
from megatron.training.tensorboard_log import TensorBoardOptions
from tests.helpers.flag_groups import resolved


def test_level_0_measures_nothing():
    timers = StepTimers(0)
    with timers.measure("train-step"):
        pass
    assert timers.take_means(1) == {}


def test_phases_are_summed_and_taken_as_milliseconds_per_iteration_in_the_lines_order():
    timers = StepTimers(1)
    for _ in range(2):
        with timers.measure("evaluate"):
            time.sleep(0.01)
    with timers.measure("train-step"):
        pass
    means = timers.take_means(2)
    assert list(means) == ["train-step", "evaluate"]
    assert means["evaluate"] >= 10.0  # two sleeps of 10 ms over two iterations: at least 10 ms each
    assert timers.take_means(2) == {}  # taken: the next interval starts from zero


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown timed phase 'forward'; add it to StepTimers.PHASES"):
        with StepTimers(1).measure("forward"):
            pass


def test_the_tensorboard_options_follow_the_logging_flags():
    config = logging_flags.section(resolved("--tensorboard-log-interval", "5", "--log-validation-ppl-to-tensorboard",
                                            "--no-log-loss-scale-to-tensorboard"))
    assert tensorboard_options(config) == TensorBoardOptions(log_interval=5, queue_size=1000, learning_rate=True,
                                                             loss_scale=False, batch_size=False, timers=False,
                                                             validation_ppl=True, memory=False)
