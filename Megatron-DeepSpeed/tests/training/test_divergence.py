"""Divergence (megatron/training/divergence.py): bad iterations judged and counted, a run that keeps diverging
stopped with one RunError naming the iterations and the checkpoint kept, no checkpoint of them or of non-finite
weights. Then, on real runs, a non-finite iteration is skipped without touching the weights, on every engine path;
a run that keeps diverging stops with exit 1, a one-line message naming the iteration, and `latest` on the last good
checkpoint."""
import math

import pytest
import torch
from tests.helpers.distributed import join_group_of_one, run_on_ranks
from tests.helpers.training import TINY_FLAGS

from megatron.errors import RunError
from megatron.training.divergence import DivergenceMonitor, kept_checkpoint, weights_are_finite

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


@pytest.fixture
def group_of_one():
    join_group_of_one()


def test_the_kept_checkpoint_in_words(tmp_path):
    assert kept_checkpoint(None) == "no checkpoint was saved before it"
    (tmp_path / "global_step4").mkdir()
    (tmp_path / "latest").write_text("global_step4")
    assert kept_checkpoint(str(tmp_path)) == f"{tmp_path / 'latest'} still names global_step4, saved before it"


def test_a_skipped_update_is_bad_except_under_a_loss_scaler(group_of_one):
    assert DivergenceMonitor(3, False, None).judge([1.0, math.nan, 2.0], [False, False, True]) == [False, True, True]
    assert DivergenceMonitor(3, True, None).judge([1.0, math.inf, 2.0], [False, False, True]) == [False, True, False]


def test_bad_iterations_in_a_row_stop_the_run_at_the_limit(group_of_one):
    monitor = DivergenceMonitor(limit=2, loss_scaling=False, save_dir=None)
    monitor.count(4, True, math.nan, math.nan, True)
    assert not monitor.may_save(4)
    monitor.count(5, False, 1.0, 1.0, False)  # a good iteration starts the count again
    assert monitor.may_save(5)
    monitor.count(6, True, math.nan, math.nan, True)
    with pytest.raises(RunError) as error:
        monitor.count(7, True, math.nan, math.nan, True)
    message = str(error.value)
    assert "\n" not in message and "iterations 6 to 7 (2 in a row, --max-consecutive-nan-iterations)" in message
    assert "no checkpoint was saved before it; lower --lr" in message


def test_a_run_that_ends_on_bad_iterations_has_diverged(group_of_one):
    monitor = DivergenceMonitor(limit=10, loss_scaling=False, save_dir=None)
    monitor.require_recovered(3)
    monitor.count(4, True, math.nan, 1.0, True)
    with pytest.raises(RunError, match="iteration 4: iterations 4 to 4 \\(the last iterations of the run\\)"):
        monitor.require_recovered(4)


def test_non_finite_weights_are_never_saved(group_of_one):
    layer = torch.nn.Linear(2, 2)
    monitor = DivergenceMonitor(limit=10, loss_scaling=False, save_dir=None)
    assert weights_are_finite(layer)
    monitor.require_finite_weights(layer, 3)
    with torch.no_grad():
        layer.bias[1] = math.inf
    assert not weights_are_finite(layer)
    with pytest.raises(RunError, match="the weights hold non-finite values, so no checkpoint of them was written"):
        monitor.require_finite_weights(layer, 3)


@pytest.mark.full
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
