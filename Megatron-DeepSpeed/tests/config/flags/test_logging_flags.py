"""Logging and evaluation flags (megatron/config/flags/logging_flags.py): defaults, upstream's misspelt alias, the
refusals, and the LoggingConfig."""
import pytest

from megatron.config.flags import logging_flags
from megatron.config.job import LoggingConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults_and_upstreams_spelling():
    values = parsed_alone(logging_flags)
    assert (values["log_interval"], values["eval_interval"], values["eval_iters"]) == (100, 1000, 100)
    assert values["log_learning_rate_to_tensorboard"] and values["log_loss_scale_to_tensorboard"]
    assert not parsed_alone(logging_flags, "--no-log-learnig-rate-to-tensorboard")["log_learning_rate_to_tensorboard"]


@pytest.mark.parametrize("changed, message", [
    ({"tensorboard_queue_size": 0}, "--tensorboard-queue-size 0 must be 1 or more"),
    ({"log_num_zeros_in_grad": True, "zero_stage": 1}, "--log-num-zeros-in-grad counts gradient entries per "
                                                       "parameter, which DeepSpeed keeps only with --zero-stage 0"),
    ({"log_num_zeros_in_grad": True, "bf16": True}, "--log-num-zeros-in-grad counts gradient entries"),
    ({"log_optimizer_states_to_tensorboard": True, "optimizer": "sgd"},
     "--log-optimizer-states-to-tensorboard reports Adam's moments; it needs --optimizer adam"),
    ({"skip_train": True, "load": None}, "--skip-train evaluates the checkpoint in --load, but --load was not given"),
    ({"skip_train": True, "load": "ckpt", "eval_iters": 0}, "--skip-train with --eval-iters 0 evaluates nothing"),
])
def test_refusals(changed, message):
    assert refusal(logging_flags.validate, {**resolved(), **changed}).startswith(message)


def test_section():
    section = logging_flags.section(resolved("--log-interval", "5", "--tensorboard-dir", "tb"))
    assert isinstance(section, LoggingConfig)
    assert (section.log_interval, section.eval_interval, section.tensorboard_dir, section.skip_train) == (
        5, 1000, "tb", False)
