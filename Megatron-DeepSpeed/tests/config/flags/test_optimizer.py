"""Optimizer flags (megatron/config/flags/optimizer.py): defaults, the refusals, the OptimizerConfig, and the one
weight-decay rule of the optimizer's groups."""
import pytest

from megatron.config.flags import optimizer
from megatron.config.job import OptimizerConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults():
    assert parsed_alone(optimizer) == {"optimizer": "adam", "weight_decay": 0.01, "clip_grad": 1.0,
                                       "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8,
                                       "sgd_momentum": 0.9, "cpu_optimizer": False, "cpu_torch_adam": False}


@pytest.mark.parametrize("changed, message", [
    ({"sgd_momentum": 1.0}, "--sgd-momentum 1.0 is out of range: it must be in [0, 1)"),
    ({"cpu_optimizer": True, "zero_stage": 0}, "--cpu-optimizer offloads ZeRO optimizer state, but --zero-stage is "
                                               "0; use --zero-stage 1, 2 or 3"),
])
def test_refusals(changed, message):
    assert refusal(optimizer.validate, {**resolved(), **changed}) == message


def test_an_unknown_optimizer_is_one_line():
    assert "argument --optimizer: invalid choice: 'lamb'" in refusal(parsed_alone, optimizer, "--optimizer", "lamb")


def test_section():
    assert optimizer.section(resolved("--optimizer", "sgd", "--weight-decay", "0.1")) == OptimizerConfig(
        lr=1e-3, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8, clip_grad=1.0,
        cpu_optimizer=False, optimizer="sgd", sgd_momentum=0.9)


def test_only_matrices_are_weight_decayed():
    assert optimizer.weight_decayed((4, 8)) and not optimizer.weight_decayed((8,))
