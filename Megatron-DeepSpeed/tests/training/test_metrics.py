"""Figures the logging flags report (megatron/training/metrics.py), on one rank: which copy of a parameter counts,
zeros among gradients, the parameter norm, Adam's moment statistics by upstream's names, and the torch optimizer
inside DeepSpeed's wrappers. Their sums over ranks: the multi-process training tests."""
import math
import types

import pytest
import torch

from megatron.training.metrics import (OPTIMIZER_STATE_TAGS, counted_once_per_replica, optimizer_state_statistics,
                                       parameters_norm, stepped_optimizer, zeros_among)
from tests.helpers.distributed import join_group_of_one

WORLD = types.SimpleNamespace(tp_rank=0, get_model_parallel_group=lambda: None,
                              get_sequence_data_parallel_group=lambda: None)  # one rank: every group is the world


@pytest.fixture(autouse=True)
def group_of_one():
    join_group_of_one()


def test_which_copy_of_a_parameter_counts():
    shard, replicated = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    shard.tensor_model_parallel = True
    assert counted_once_per_replica(shard, 1) and counted_once_per_replica(replicated, 0)
    assert not counted_once_per_replica(replicated, 1)
    replicated.ds_pipe_replicated = True
    assert not counted_once_per_replica(replicated, 0)


def test_zeros_and_the_parameter_norm():
    assert zeros_among([torch.tensor([0.0, 1.0, 0.0]), torch.zeros(2, 2)]).item() == 6.0
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 0.0]]))
        layer.bias.fill_(4.0)
    assert parameters_norm(layer, WORLD) == pytest.approx(5.0)


def test_adams_moment_statistics():
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    adam = torch.optim.Adam([weight], lr=0.1)
    weight.grad = torch.tensor([0.5, -1.0])
    adam.step()
    state = adam.state[weight]
    figures = optimizer_state_statistics(adam, WORLD, partitioned=False)
    assert list(figures) == list(OPTIMIZER_STATE_TAGS)
    assert figures["momentum_l2"] == pytest.approx(state["exp_avg"].norm().item())
    assert figures["variance_l1"] == pytest.approx(state["exp_avg_sq"].abs().sum().item())
    assert figures["variance_sqrt_abs_max"] == pytest.approx(math.sqrt(state["exp_avg_sq"].max().item()))
    assert figures["weight_abs_max"] == pytest.approx(weight.detach().abs().max().item())


def test_the_stepped_optimizer_is_found_inside_its_wrappers():
    adam = torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])
    wrapped = types.SimpleNamespace(optimizer=types.SimpleNamespace(optimizer=adam))
    assert stepped_optimizer(wrapped) is adam and stepped_optimizer(adam) is adam
