"""NonFiniteStepGuard on plain torch optimizers, one rank: a step whose norm is not finite changes neither the
weights nor the optimizer state, with the fused AdamW (skipped on the device through found_inf) and with an
optimizer that has no such input (gradients dropped); finite steps go through; a step taken group by group, as
ZeRO takes it, is judged once. Inside DeepSpeed's ZeRO (the norm its clipping computes): test_divergence.py."""
import functools
import json

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import TINY_FLAGS, step_history

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.errors import InputError
from megatron.model.kernels import FUSED_ADAMW_READS_FOUND_INF
from megatron.training.loop import engine_config
from megatron.training.nonfinite_step_guard import NonFiniteStepGuard

class FoundInfIgnoredAdamW(torch.optim.AdamW):
    """Fused AdamW whose kernel does not read found_inf, as op-plugin's _fused_adamw_ for NPUs
    (op_plugin/ops/opapi/FusedAdamWKernelNpuOpApi.cpp, Ascend/op-plugin 517f2e7d0f202f38b76310706cb977ca2388ad21)."""

    def step(self, closure=None):
        self.found_inf = None
        return super().step(closure)


OPTIMIZERS = {
    "fused AdamW": functools.partial(torch.optim.AdamW, lr=0.1, fused=True),
    "AdamW, not fused": functools.partial(torch.optim.AdamW, lr=0.1, foreach=False),
    "SGD with momentum": functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    # as on an NPU, whose fused kernel (op-plugin's) ignores found_inf: the guard must drop the gradients instead
    "fused AdamW, kernel without found_inf": functools.partial(FoundInfIgnoredAdamW, lr=0.1, fused=True),
}
FOUND_INF_DEVICES = {"fused AdamW, kernel without found_inf": frozenset()}


def steps_with_one_bad_gradient(optimizer_name):
    """Three steps, the second with a NaN gradient: the weights and state after each, and the skipped count."""
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    optimizer = OPTIMIZERS[optimizer_name]([weight])
    guard = NonFiniteStepGuard(lambda: torch.linalg.vector_norm(weight.grad),
                               FOUND_INF_DEVICES.get(optimizer_name, FUSED_ADAMW_READS_FOUND_INF))
    optimizer.register_step_pre_hook(guard)
    history = step_history(optimizer, weight, ([0.5, 0.5, -1.0], [0.5, float("nan"), -1.0], [1.0, 0.0, 2.0]))
    return history, guard.skipped_steps


def unguarded_steps(optimizer_name):
    """What the optimizer does with the first and third gradients only."""
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    optimizer = OPTIMIZERS[optimizer_name]([weight])
    for gradient in ([0.5, 0.5, -1.0], [1.0, 0.0, 2.0]):
        weight.grad = torch.tensor(gradient)
        optimizer.step()
    return weight.detach().clone()


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_a_non_finite_step_changes_nothing_and_the_others_go_through(optimizer_name):
    [(history, skipped)] = run_on_ranks(steps_with_one_bad_gradient, 1, optimizer_name)
    (after_first, state_first), (after_bad, state_bad), (after_third, _) = history
    assert skipped == 1
    assert torch.equal(after_bad, after_first)
    assert state_bad.keys() == state_first.keys()
    for name in state_first:
        assert torch.equal(state_bad[name], state_first[name]), name
    assert not torch.equal(after_third, after_bad)
    assert torch.equal(after_third, unguarded_steps(optimizer_name))  # as if the bad step had never come


def test_a_step_taken_one_parameter_group_at_a_time_is_judged_and_counted_once():
    """ZeRO steps the torch optimizer once per parameter group, each time with the step's one norm."""
    weights = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))]
    optimizer = torch.optim.AdamW([{"params": [weights[0]]}, {"params": [weights[1]]}], lr=0.1, fused=True)
    norms = [torch.tensor(float("nan"))]
    guard = NonFiniteStepGuard(lambda: norms[-1])
    optimizer.register_step_pre_hook(guard)
    all_groups = optimizer.param_groups
    for _ in range(2):  # a bad step, then a good one
        for weight in weights:
            weight.grad = torch.ones_like(weight)
        for group in all_groups:
            optimizer.param_groups = [group]
            optimizer.step()
        optimizer.param_groups = all_groups
        norms.append(torch.tensor(2.0))
    assert guard.skipped_steps == 1
    assert [optimizer.state[weight]["step"].item() for weight in weights] == [1.0, 1.0]  # the good step only


def test_a_users_json_without_zeros_norm_is_refused_where_the_guard_reads_it(tmp_path):
    user_json = tmp_path / "ds.json"
    user_json.write_text(json.dumps({"zero_optimization": {"compute_grad_norm": False}}))
    argv = [*TINY_FLAGS, "--micro-batch-size", "2", "--train-iters", "5", "--mock-data", "--bf16", "--zero-stage",
            "1", "--clip-grad", "0", "--deepspeed_config", str(user_json)]
    config = job_config(validate_args(parse_args(argv), 1, "cpu"))
    assert engine_config(config, pipelined=False, clipping_ourselves=False)["zero_optimization"][
        "compute_grad_norm"] is False  # nothing reads it without the guard
    with pytest.raises(InputError, match=f"--deepspeed_config {user_json} sets zero_optimization.compute_grad_norm="):
        engine_config(config, pipelined=False, clipping_ourselves=False, guarding_steps_ourselves=True)
