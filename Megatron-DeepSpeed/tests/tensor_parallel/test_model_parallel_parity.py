"""The GPT model under tensor (and sequence) parallelism computes what the single-process model computes.

The same seed builds the same model on every rank and in this process; apply_tensor_parallel shards it; five
SGD steps on the same batches must give the single-process losses (1e-5 relative) and, gathered back, the
single-process weights, padded vocabulary rows included. With dropout on: attention-probability masks differ
across TP ranks, hidden-dropout masks are shared without sequence parallelism and differ with it, and
activation recomputation repeats every mask exactly.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.distributed import run_on_ranks
from megatron import device
from megatron.errors import InputError
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.parallelize import apply_tensor_parallel, tensor_parallel_partition_dim
from tests.helpers.model_state import gather_full_state_dict
from megatron.parallel_state import ParallelState
from megatron.tensor_parallel import sum_sequence_parallel_gradients_each_step, tensor_parallel_rng_tracker
from megatron.tokenizer import vocab_size_with_padding

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

REAL_VOCAB = 45  # divisible by neither 2 nor 4: padding is exercised
MODEL = dict(max_position_embeddings=16, num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
             hidden_dropout=0.0, attention_dropout=0.0)
STEPS, BATCH, SEQ = 5, 2, 8


def padded_vocab(tp_size):
    return vocab_size_with_padding(REAL_VOCAB, make_vocab_size_divisible_by=8, tensor_model_parallel_size=tp_size)


def build_model(tp_size, seed=3, **overrides):
    torch.manual_seed(seed)
    return GPTModel(GPTConfig(vocab_size=padded_vocab(tp_size), **{**MODEL, **overrides}))


def batches():
    generator = torch.Generator().manual_seed(9)
    for step in range(STEPS):
        tokens = torch.randint(0, REAL_VOCAB, (BATCH, SEQ + 1), generator=generator)
        loss_mask = torch.ones(BATCH, SEQ)
        loss_mask[step % BATCH, : step + 1] = 0.0  # a different masked prefix each step
        yield tokens, loss_mask


def train(model):
    """SGD, not Adam: Adam divides by the gradient's magnitude, so where the exact gradient is zero (the key
    bias: softmax ignores a shift shared by all keys) it turns rounding noise into full-size steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for tokens, loss_mask in batches():
        loss = model(tokens[:, :-1], labels=tokens[:, 1:], loss_mask=loss_mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def parallel_training(state, sequence_parallel, **overrides):
    tp_size = state.get_tensor_model_parallel_world_size()
    model = apply_tensor_parallel(build_model(tp_size, **overrides), state, sequence_parallel,
                                  rng_tracker=tensor_parallel_rng_tracker(3, state.get_tensor_model_parallel_rank()))
    sum_sequence_parallel_gradients_each_step(model, state.get_tensor_model_parallel_group(), micro_batches_per_step=1)
    return train(model), gather_full_state_dict(model, state)


def sharding_layout(state):
    """For every parameter of the sequence-parallel model: (the dim its shard was cut along, or None where it
    is whole; whether it is marked sequence-parallel)."""
    model = apply_tensor_parallel(build_model(2), state, sequence_parallel=True,
                                  rng_tracker=tensor_parallel_rng_tracker(3, state.get_tensor_model_parallel_rank()))
    return {name: (parameter.partition_dim if getattr(parameter, "tensor_model_parallel", False) else None,
                   getattr(parameter, "sequence_parallel", False)) for name, parameter in model.named_parameters()}


# --- dropout on ------------------------------------------------------------------------------------------

class RecordingAttention:
    """Causal attention by hand that records its dropout masks (as `kernels` would compute it)."""

    def __init__(self):
        self.masks = []

    def __call__(self, query, key, value, spec):
        seq, dropout_p = query.shape[-2], spec.dropout_p
        scores = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
        future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        keep = F.dropout(torch.ones_like(scores), dropout_p)
        self.masks.append(keep != 0)
        return (scores.masked_fill(future, float("-inf")).softmax(-1) * keep) @ value


def dropout_run(state, sequence_parallel, checkpoint_activations):
    model = build_model(2, seed=5, hidden_dropout=0.3, attention_dropout=0.5,
                        checkpoint_activations=checkpoint_activations)
    recorder = RecordingAttention()
    for layer in model.layers:
        layer.self_attention.attend = recorder
    apply_tensor_parallel(model, state, sequence_parallel,
                          rng_tracker=tensor_parallel_rng_tracker(5, state.get_tensor_model_parallel_rank()))
    hidden_dropout_zeros = []
    for layer in model.layers:
        layer.dropout.register_forward_hook(lambda module, inputs, output: hidden_dropout_zeros.append(output == 0))
    device.manual_seed(11)  # the default stream: identical on both ranks
    tokens, _ = next(batches())
    loss = model(tokens[:, :-1], labels=tokens[:, 1:])
    loss.backward()
    return {"loss": loss.item(), "grads": {name: p.grad for name, p in model.named_parameters()},
            "attention_masks": recorder.masks, "hidden_dropout_zeros": hidden_dropout_zeros}


def on_two_ranks():
    state = ParallelState(tensor_parallel_size=2)
    results = {("train", sequence_parallel): parallel_training(state, sequence_parallel)
               for sequence_parallel in (False, True)}
    for sequence_parallel in (False, True):
        for checkpoint_activations in (False, True):
            results[("dropout", sequence_parallel, checkpoint_activations)] = dropout_run(
                state, sequence_parallel, checkpoint_activations)
    results["layout"] = sharding_layout(state)
    sharded = apply_tensor_parallel(build_model(2), state, rng_tracker=tensor_parallel_rng_tracker(3, 0))
    try:
        apply_tensor_parallel(sharded, state, rng_tracker=tensor_parallel_rng_tracker(3, 0))
    except TypeError as error:
        results["twice_error"] = str(error)
    try:
        apply_tensor_parallel(build_model(2, hidden_size=24, num_attention_heads=3), state,
                              rng_tracker=tensor_parallel_rng_tracker(3, 0))
    except InputError as error:
        results["heads_error"] = str(error)
    return results


def on_four_ranks():
    state = ParallelState(tensor_parallel_size=4)
    return parallel_training(state, sequence_parallel=True, checkpoint_activations=True)


@pytest.fixture(scope="module")
def two_ranks():
    return run_on_ranks(on_two_ranks, 2)


@pytest.fixture(scope="module")
def four_ranks():
    return run_on_ranks(on_four_ranks, 4)


def single_process_training(tp_size):
    model = build_model(tp_size)
    return train(model), model.state_dict()


def assert_same_training(parallel_results, tp_size):
    expected_losses, expected_weights = single_process_training(tp_size)
    initial_weights = build_model(tp_size).state_dict()
    moved = max((expected_weights[name] - initial).abs().max().item() for name, initial in initial_weights.items())
    assert moved > 3e-3  # the comparison below is not between untouched weights
    for rank, (losses, weights) in enumerate(parallel_results):
        assert losses == pytest.approx(expected_losses, rel=1e-5), rank
        assert weights.keys() == expected_weights.keys()
        for name, expected in expected_weights.items():
            assert weights[name].shape == expected.shape, name
            assert torch.allclose(weights[name], expected, rtol=1e-5, atol=1e-6), (rank, name)
    assert weights["embedding.word_embeddings.weight"].shape[0] == padded_vocab(tp_size)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp2_training_matches_single_process(two_ranks, sequence_parallel):
    assert_same_training([result[("train", sequence_parallel)] for result in two_ranks], tp_size=2)


def test_tp4_sequence_parallel_with_recomputation_matches_single_process(four_ranks):
    assert padded_vocab(4) == 64 and padded_vocab(2) == 48
    assert_same_training(four_ranks, tp_size=4)


def test_attention_dropout_differs_across_tp_ranks_and_recomputation_repeats_it(two_ranks):
    for sequence_parallel in (False, True):
        key = ("dropout", sequence_parallel, True)
        rank0, rank1 = (result[key]["attention_masks"] for result in two_ranks)
        assert len(rank0) == 4  # layers 0, 1 forward, then recomputed in backward: layer 1 first
        assert rank0[0].shape == (BATCH, 2, SEQ, SEQ)  # this rank's 2 of the 4 heads
        assert not torch.equal(rank0[0], rank1[0])  # different heads, different masks
        for masks in (rank0, rank1):
            assert torch.equal(masks[3], masks[0]) and torch.equal(masks[2], masks[1])


def test_hidden_dropout_shared_without_sequence_parallel_and_per_rank_with_it(two_ranks):
    replicated = [result[("dropout", False, False)]["hidden_dropout_zeros"] for result in two_ranks]
    assert replicated[0][0].shape == (BATCH, SEQ, 32)
    assert all(torch.equal(a, b) for a, b in zip(*replicated))  # replicas must stay identical
    chunks = [result[("dropout", True, False)]["hidden_dropout_zeros"] for result in two_ranks]
    assert chunks[0][0].shape == (BATCH, SEQ // 2, 32)
    assert not any(torch.equal(a, b) for a, b in zip(*chunks))  # different tokens, different masks


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_recomputation_with_dropout_gives_the_same_loss_and_grads(two_ranks, sequence_parallel):
    for result in two_ranks:
        plain = result[("dropout", sequence_parallel, False)]
        recomputed = result[("dropout", sequence_parallel, True)]
        assert plain["loss"] == recomputed["loss"]
        for name, grad in plain["grads"].items():
            assert torch.equal(grad, recomputed["grads"][name]), name
    assert two_ranks[0][("dropout", sequence_parallel, False)]["loss"] == \
        two_ranks[1][("dropout", sequence_parallel, False)]["loss"]


def test_heads_not_divisible_by_tp_size_is_an_input_error(two_ranks):
    assert two_ranks[0]["heads_error"].startswith(
        "--num-attention-heads 3 is not divisible by --tensor-model-parallel-size 2")


def test_the_sharded_model_is_split_and_marked_as_the_plan_says(two_ranks):
    layout = two_ranks[0]["layout"]
    assert layout.keys() == build_model(2).state_dict().keys()
    for name, (cut_along, marked) in layout.items():
        split = tensor_parallel_partition_dim(name)
        assert cut_along == (None if split is None else split.dim), name
        assert marked == ("layernorm" in name or name.endswith(("self_attention.dense.bias", "dense_4h_to_h.bias"))), name


def test_applying_the_plan_twice_is_refused(two_ranks):
    assert two_ranks[0]["twice_error"].startswith("the tensor-parallel plan expects Embedding at "
                                                  "'embedding.word_embeddings' but found VocabParallelEmbedding")
