"""A non-finite iteration is skipped without touching the weights, on every engine path; a run that keeps
diverging stops with exit 1, a one-line message naming the iteration, and `latest` on the last good
checkpoint."""
import math

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import TINY_FLAGS

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

MICRO_BATCHES = 2
POISONED = 3  # the iteration whose forward pass turns to NaN
FLAGS = [*TINY_FLAGS, "--micro-batch-size", "2", "--global-batch-size", str(2 * MICRO_BATCHES), "--train-iters", "5",
         "--log-interval", "1", "--eval-iters", "0"]


def train_with_poisoned_iterations(argv, poisoned):
    """Train with the first MLP's output turned to NaN in the `poisoned` iterations; returns the losses, the
    flat weights at the start of each iteration, and whether the final weights are finite."""
    from megatron.model.gpt import MLP
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    weights, forwards = {}, [0]

    def provider(*args):
        model = model_provider(*args)
        mlp = next(module for module in model.modules() if isinstance(module, MLP))

        def iteration():
            return forwards[0] // MICRO_BATCHES + 1

        def before(module, inputs):
            if module.training and forwards[0] % MICRO_BATCHES == 0:
                weights[iteration()] = torch.cat([p.detach().float().flatten() for p in model.parameters()])

        def after(module, inputs, output):
            poison = module.training and iteration() in poisoned
            forwards[0] += module.training
            return output * float("nan") if poison else output

        mlp.register_forward_pre_hook(before)
        mlp.register_forward_hook(after)
        return model

    result = pretrain(provider, argv)
    finite = all(bool(torch.isfinite(p).all()) for p in result.model.parameters())
    return result.losses, weights, finite


@pytest.mark.parametrize("engine_flags", [
    ["--zero-stage", "0"],  # pipeline engine, fp32, no ZeRO: the loop's clipping drops the step
    ["--no-pipeline-parallel", "--zero-stage", "1"],  # DeepSpeed's ZeRO optimizer, fp32
    ["--no-pipeline-parallel", "--zero-stage", "0", "--bf16"],  # DeepSpeed's bf16 optimizer
    ["--no-pipeline-parallel", "--zero-stage", "1", "--bf16"],  # ZeRO's bf16 path: NonFiniteStepGuard skips
    ["--zero-stage", "1", "--bf16"],  # the same on the pipeline engine
], ids=["pipeline-fp32-zero0", "plain-fp32-zero1", "plain-bf16-zero0", "plain-bf16-zero1", "pipeline-bf16-zero1"])
def test_a_non_finite_iteration_leaves_the_weights_alone(engine_flags, data_prefix):
    (losses, weights, finite), = run_on_ranks(train_with_poisoned_iterations, 1,
                                              [*FLAGS, "--data-path", data_prefix, *engine_flags], {POISONED})
    assert [math.isfinite(loss) for loss in losses] == [True, True, False, True, True]
    assert torch.equal(weights[POISONED + 1], weights[POISONED])  # the skipped update
    assert not torch.equal(weights[POISONED], weights[POISONED - 1])  # an ordinary one changes them
    assert finite and losses[-1] < losses[0]  # the optimizer state was not poisoned either
