"""Shared by the training tests: a learnable Megatron-format dataset, a tiny model's flags, the parity
check of a parallel run against single-process training, and the lines a run logs."""
import logging

import numpy as np
import pytest
import torch

from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder

VOCAB = 200  # NullTokenizer: eod = 200; padded to 256 at TP 1, 2 and 4 with --make-vocab-size-divisible-by 64

TINY_FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
              "--lr", "1e-2", "--min-lr", "1e-3", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
              "--hidden-dropout", "0", "--attention-dropout", "0", "--tokenizer-type", "NullTokenizer",
              "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "64", "--split", "90,10,0",
              "--num-workers", "0", "--seed", "7"]


def write_counting_dataset(prefix: str, documents: int = 400) -> str:
    """Documents that count upwards with a per-document step: easy to learn, so the loss must fall."""
    rng = np.random.default_rng(0)
    with MMapIndexedDatasetBuilder(prefix, np.uint16) as builder:
        for _ in range(documents):
            start, step, length = rng.integers(0, VOCAB), rng.integers(1, 4), rng.integers(20, 120)
            builder.add_item((start + step * np.arange(length)) % VOCAB)
            builder.end_document()
    return prefix


ITERATIONS = 5
# Global batch 8 = micro batch 2 x DP x gradient-accumulation steps, for every layout below.
COMMON = [*TINY_FLAGS, "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(ITERATIONS),
          "--log-interval", "1", "--eval-iters", "0", "--adam-eps", "1e-4"]
# --adam-eps: the attention key bias has an exactly zero true gradient (softmax ignores a constant shift), so
# Adam with a tiny eps would turn rounding noise into full-size steps that differ between layouts.


def train(argv):
    """pretrain() on this rank; rank 0 returns the losses and the full (TP-gathered, ZeRO-3-gathered) weights."""
    import deepspeed
    import torch.distributed as dist

    from tests.helpers.model_state import gather_full_state_dict
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    result = pretrain(model_provider, argv)
    with deepspeed.zero.GatheredParameters(list(result.model.parameters())):
        weights = gather_full_state_dict(result.model, result.parallel)
    return (result.losses, weights) if dist.get_rank() == 0 else None


def assert_same_training(result, reference):
    losses, weights = result
    reference_losses, reference_weights = reference
    assert len(reference_losses) == ITERATIONS and len(reference_weights) > 10
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    assert weights.keys() == reference_weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, reference_weights[name], rtol=1e-4, atol=1e-5, msg=name)


def step_history(optimizer, weight, gradients):
    """Step `optimizer` once per gradient of `weight`: the weights and the optimizer's tensor state after each step."""
    history = []
    for gradient in gradients:
        weight.grad = torch.tensor(gradient)
        optimizer.step()
        state = {name: value.clone() for name, value in optimizer.state[weight].items() if torch.is_tensor(value)}
        history.append((weight.detach().clone(), state))
    return history


def logged_lines(run) -> list:
    """The lines run() logs on this rank (the last rank logs the training and evaluation lines)."""
    lines = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.extend(record.getMessage().splitlines())
    logger = logging.getLogger("megatron")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    run()
    return lines


def assert_resumed_with_the_adam_state(run, argv, load_dir, iteration, out):
    """A run of `argv` resuming `load_dir` at `iteration` holds that checkpoint's Adam state, bit for bit: it saves
    before its first step (--train-iters at the loaded iteration) into `out`, and both checkpoints' master weights,
    moments and step, read per parameter, are equal. Unlike comparing the next steps' losses with and without the
    moments, this does not depend on which bf16 kernels the CPU runs (issue 48: AVX512-BF16 and AMX move bf16 sums
    by more than the moments' effect over one step)."""
    from megatron.checkpoint.formats.optimizer_state import read_optimizer_state
    from megatron.checkpoint.formats.reader import read_checkpoint
    run(argv + ["--load", str(load_dir), "--train-iters", str(iteration), "--use-checkpoint-lr-scheduler",
                "--save", str(out), "--save-interval", "1000"])
    expected = read_optimizer_state(read_checkpoint(str(load_dir), iteration))
    held = read_optimizer_state(read_checkpoint(str(out), iteration))
    assert held.step == expected.step
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        assert set(held.tensors(kind)) == set(expected.tensors(kind)), kind
        for name, tensor in expected.tensors(kind).items():
            torch.testing.assert_close(held.tensors(kind)[name], tensor, rtol=0, atol=0, msg=f"{kind} {name}")
