"""Fp32GradientClipping on one rank: the norm and clipped gradients of torch's clip_grad_norm_, kept as tensors;
a non-finite step leaves weights and optimizer state alone, skipped on the device (fused AdamW) or by dropping
the gradients (an optimizer without found_inf). Inside whole runs: test_divergence.py, test_pipeline.py."""
import functools
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import step_history

from megatron.training.clipping import Fp32GradientClipping

OPTIMIZERS = {"fused AdamW": functools.partial(torch.optim.AdamW, lr=0.1, fused=True),
              "SGD": functools.partial(torch.optim.SGD, lr=0.1)}
GRADIENTS = ([3.0, -4.0], [12.0, 0.0])  # norm 13


def one_rank():
    return SimpleNamespace(tp_rank=0, get_model_parallel_group=lambda: dist.group.WORLD)


MAX_NORMS = (1.0, 100.0, 0.0)  # clipped, under the limit, clipping off


def clip_each(max_norms):
    return [clip(max_norm) for max_norm in max_norms]


def clip(max_norm):
    model = torch.nn.Sequential(torch.nn.Linear(1, 2), torch.nn.Linear(2, 1, bias=False))
    parameters = [model[0].bias, model[1].weight]
    clipping = Fp32GradientClipping(model, one_rank(), max_norm, count_zeros=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    optimizer.register_step_pre_hook(clipping)
    for parameter, gradient in zip(parameters, GRADIENTS):
        parameter.grad = torch.tensor(gradient).reshape(parameter.shape)
    model[0].weight.grad = torch.zeros(2, 1)
    optimizer.step()
    return clipping.norm, clipping.num_zeros, [p.grad.flatten().tolist() for p in parameters], clipping.skipped


def test_the_norm_and_clipped_gradients_of_clip_grad_norm():
    [results] = run_on_ranks(clip_each, 1, MAX_NORMS)  # one process for all: each costs seconds here
    for max_norm, (norm, zeros, gradients, skipped) in zip(MAX_NORMS, results):
        assert isinstance(norm, torch.Tensor) and norm.item() == pytest.approx(13.0)
        assert zeros.item() == 3.0 and skipped.item() == 0.0
        scale = min(1.0, max_norm / (13.0 + 1e-6)) if max_norm > 0 else 1.0
        assert gradients == [pytest.approx([g * scale for g in gradient]) for gradient in GRADIENTS], max_norm


def steps_with_one_bad_gradient(optimizer_name):
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    model = torch.nn.Module()
    model.weight = weight
    clipping = Fp32GradientClipping(model, one_rank(), max_norm=1.0)
    optimizer = OPTIMIZERS[optimizer_name]([weight])
    optimizer.register_step_pre_hook(clipping)
    history = step_history(optimizer, weight, ([0.5, 0.5, -1.0], [0.5, float("nan"), -1.0], [1.0, 0.0, 2.0]))
    return history, clipping.skipped_steps


def steps_of_each_optimizer():
    return {name: steps_with_one_bad_gradient(name) for name in OPTIMIZERS}


def test_a_non_finite_step_changes_nothing():
    [runs] = run_on_ranks(steps_of_each_optimizer, 1)
    for optimizer_name, (history, skipped) in runs.items():
        (after_first, state_first), (after_bad, state_bad), (after_third, _) = history
        assert skipped == 1, optimizer_name
        assert torch.equal(after_bad, after_first) and not torch.equal(after_third, after_bad), optimizer_name
        for name in state_first:
            assert torch.equal(state_bad[name], state_first[name]), (optimizer_name, name)
