"""The tensor-parallel package on 2 real processes: every mapping's forward and backward on hand-checkable
tensors, the parallel layers and the vocab-parallel cross entropy against single-process torch (values and
grads), plus the RNG tracker and its checkpoint helper (in this process: they need no process group)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.helpers.distributed import run_on_ranks

from megatron import tensor_parallel as tp
from megatron.errors import InputError
from megatron.model.cross_entropy import cross_entropy
from megatron.parallel_state import ParallelState
from megatron.tokenizer import vocab_size_with_padding

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier


def forward_backward(function, tensor, upstream_grad):
    """function(tensor) and the gradient reaching `tensor` when `upstream_grad` flows back into the output."""
    tensor = tensor.clone().requires_grad_(True)
    output = function(tensor)
    output.backward(upstream_grad)
    return output.detach(), tensor.grad


def mappings_on_this_rank(group):
    rank = dist.get_rank(group)
    local = torch.tensor([[1.0, 2.0], [3.0, 4.0]]) + 10 * rank  # rank 0: 1..4, rank 1: 11..14
    full = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    ones = torch.ones(2, 2) * (rank + 1)
    results = {
        "copy": forward_backward(lambda t: tp.copy_to_tensor_parallel_region(t, group), local, ones),
        "reduce": forward_backward(lambda t: tp.reduce_from_tensor_parallel_region(t, group), local, ones),
        "gather": forward_backward(lambda t: tp.gather_from_tensor_parallel_region(t, group), local, full),
        "scatter": forward_backward(lambda t: tp.scatter_to_tensor_parallel_region(t, group), full, ones),
    }
    # Sequence dim = 1 of [batch 2, seq, hidden 3]; values depend on the rank so mix-ups show.
    sequence_full = torch.arange(24.0).view(2, 4, 3) + 100 * rank
    sequence_chunk = torch.arange(12.0).view(2, 2, 3) + 100 * rank
    results["sequence_scatter"] = forward_backward(
        lambda t: tp.scatter_to_sequence_parallel_region(t, group), sequence_full, sequence_chunk)
    results["sequence_gather"] = forward_backward(
        lambda t: tp.gather_from_sequence_parallel_region(t, group), sequence_chunk, sequence_full)
    results["sequence_reduce_scatter"] = forward_backward(
        lambda t: tp.reduce_scatter_to_sequence_parallel_region(t, group), sequence_full, sequence_chunk)
    return results


def linear_layers_on_this_rank(group):
    """Each parallel layer next to torch's own full layer on the same weights and inputs."""
    rank = dist.get_rank(group)
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(6, 8)
    torch.nn.init.normal_(linear.bias, generator=generator)
    torch.nn.init.normal_(linear.weight, generator=generator)
    inputs = torch.randn(2, 4, 6, generator=generator)  # [batch, seq 4, hidden 6]
    upstream = torch.randn(2, 4, 8, generator=generator)
    results = {}
    for sequence_parallel in (False, True):
        column = tp.ColumnParallelLinear(linear.weight, linear.bias, group, sequence_parallel)
        local_input = inputs[:, 2 * rank:2 * rank + 2] if sequence_parallel else inputs
        output, input_grad = forward_backward(column, local_input, upstream[..., 4 * rank:4 * rank + 4])
        results[("column", sequence_parallel)] = (output, input_grad, column.weight.grad, column.bias.grad)

    row_linear = torch.nn.Linear(8, 6)
    torch.nn.init.normal_(row_linear.bias, generator=generator)
    row_inputs = torch.randn(2, 4, 8, generator=generator)
    row_upstream = torch.randn(2, 4, 6, generator=generator)
    for sequence_parallel in (False, True):
        row = tp.RowParallelLinear(row_linear.weight, row_linear.bias, group, sequence_parallel)
        tp.sum_sequence_parallel_gradients_each_step(row, group, micro_batches_per_step=1)
        upstream_here = row_upstream[:, 2 * rank:2 * rank + 2] if sequence_parallel else row_upstream
        output, input_grad = forward_backward(row, row_inputs[..., 4 * rank:4 * rank + 4], upstream_here)
        results[("row", sequence_parallel)] = (output, input_grad, row.weight.grad, row.bias.grad,
                                               getattr(row.bias, "sequence_parallel", False))
    results["row_weight_marks"] = (row.weight.tensor_model_parallel, row.weight.partition_dim,
                                   column.weight.partition_dim)
    return results, (linear, inputs, upstream), (row_linear, row_inputs, row_upstream)


def embedding_and_cross_entropy_on_this_rank(group):
    rank = dist.get_rank(group)
    generator = torch.Generator().manual_seed(1)
    vocab = vocab_size_with_padding(5, make_vocab_size_divisible_by=2, tensor_model_parallel_size=2)  # 5 -> 8
    weight = torch.randn(vocab, 3, generator=generator)
    ids = torch.tensor([[0, 3, 4, 7], [5, 1, 2, 4]])  # ids from both halves of the vocabulary
    upstream = torch.randn(2, 4, 3, generator=generator)
    embedding = tp.VocabParallelEmbedding(weight, group)
    output = embedding(ids)
    output.backward(upstream)

    logits = torch.randn(2, 4, vocab, generator=generator) * 5 + 1000  # large: must not overflow
    labels = torch.tensor([[0, 3, 4, 7], [5, 6, 2, 1]])  # 6 and 7 are padded rows
    loss_weights = torch.randn(2, 4, generator=generator)
    local_logits = logits[..., 4 * rank:4 * rank + 4].clone().requires_grad_(True)
    losses = cross_entropy(local_logits, labels, group, chunk_bytes=4 * 4 * 3)  # 3 rows a chunk
    (losses * loss_weights).sum().backward()
    bf16_losses = cross_entropy(local_logits.detach().bfloat16(), labels, group)
    return {"vocab": vocab, "embedding": (output.detach(), embedding.weight.grad),
            "cross_entropy": (losses.detach(), local_logits.grad), "bf16_dtype": bf16_losses.dtype,
            "inputs": (weight, ids, upstream, logits, labels, loss_weights)}


def layer_norm_micro_batch(rank, micro_batch):
    """Inputs for a LayerNorm(3) on `rank`'s sequence chunk in `micro_batch`, and the upstream gradient."""
    inputs = torch.tensor([[0.0, 1.0, 3.0], [2.0, -1.0, 0.5]]) + rank * torch.tensor([[1.0, 0.0, -1.0],
                                                                                        [0.0, 2.0, 0.0]])
    upstream = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.7, -1.0]]) + micro_batch * torch.tensor([[0.0, 1.0, 0.0],
                                                                                                 [2.0, 0.0, 1.0]])
    return inputs, upstream


def gradient_sum_on_this_rank(group):
    """A LayerNorm used on sequence chunks, two micro-batches per step: its gradients after each backward, then
    the error when backward passes reach the weight twice before the bias once."""
    norm = torch.nn.LayerNorm(3)
    for parameter in norm.parameters():
        tp.mark_sequence_parallel(parameter)
    tp.sum_sequence_parallel_gradients_each_step(norm, group, micro_batches_per_step=2)
    gradients = []
    for micro_batch in range(2):
        inputs, upstream = layer_norm_micro_batch(dist.get_rank(group), micro_batch)
        norm(inputs).backward(upstream)
        gradients.append((norm.weight.grad.clone(), norm.bias.grad.clone()))
    norm.weight.sum().backward()
    with pytest.raises(RuntimeError) as caught:
        norm.weight.sum().backward()
    return gradients, str(caught.value)


def input_errors_on_this_rank(group):
    messages = []
    for attempt in (lambda: tp.scatter_to_sequence_parallel_region(torch.zeros(1, 3, 2), group),
                    lambda: tp.ColumnParallelLinear(torch.zeros(5, 4), None, group),
                    lambda: tp.VocabParallelEmbedding(torch.zeros(7, 4), group)):
        try:
            attempt()
        except InputError as error:
            messages.append(str(error))
    return messages


def everything_on_two_ranks():
    group = ParallelState(tensor_parallel_size=2).get_tensor_model_parallel_group()
    layers, column_case, row_case = linear_layers_on_this_rank(group)
    return {"mappings": mappings_on_this_rank(group), "layers": layers, "column_case": column_case,
            "row_case": row_case, "embedding": embedding_and_cross_entropy_on_this_rank(group),
            "errors": input_errors_on_this_rank(group), "gradient_sum": gradient_sum_on_this_rank(group)}


@pytest.fixture(scope="module")
def two_ranks():
    return run_on_ranks(everything_on_two_ranks, 2)


# --- mappings, by hand ---------------------------------------------------------------------------------

def test_copy_and_reduce(two_ranks):
    for rank, result in enumerate(two_ranks):
        output, grad = result["mappings"]["copy"]
        assert torch.equal(output, torch.tensor([[1.0, 2.0], [3.0, 4.0]]) + 10 * rank)  # identity
        assert torch.equal(grad, torch.full((2, 2), 3.0))  # upstream 1 + 2, summed over the ranks
        output, grad = result["mappings"]["reduce"]
        assert torch.equal(output, torch.tensor([[12.0, 14.0], [16.0, 18.0]]))  # (1..4) + (11..14)
        assert torch.equal(grad, torch.full((2, 2), rank + 1.0))  # identity


def test_gather_and_scatter_along_the_last_dim(two_ranks):
    rank0, rank1 = (result["mappings"] for result in two_ranks)
    for result in (rank0, rank1):
        assert torch.equal(result["gather"][0], torch.tensor([[1.0, 2.0, 11.0, 12.0], [3.0, 4.0, 13.0, 14.0]]))
        assert torch.equal(result["scatter"][1], torch.tensor([[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]]))
    assert torch.equal(rank0["gather"][1], torch.tensor([[1.0, 2.0], [5.0, 6.0]]))  # backward: own columns
    assert torch.equal(rank1["gather"][1], torch.tensor([[3.0, 4.0], [7.0, 8.0]]))
    assert torch.equal(rank0["scatter"][0], torch.tensor([[1.0, 2.0], [5.0, 6.0]]))
    assert torch.equal(rank1["scatter"][0], torch.tensor([[3.0, 4.0], [7.0, 8.0]]))


def test_sequence_parallel_mappings_split_and_join_dim_1(two_ranks):
    full = [torch.arange(24.0).view(2, 4, 3) + 100 * rank for rank in range(2)]
    chunk = [torch.arange(12.0).view(2, 2, 3) + 100 * rank for rank in range(2)]
    joined_chunks = torch.cat(chunk, dim=1)  # all-gather along the sequence
    summed_full = full[0] + full[1]
    for rank, result in enumerate(two_ranks):
        mine = slice(2 * rank, 2 * rank + 2)
        output, grad = result["mappings"]["sequence_scatter"]
        assert torch.equal(output, full[rank][:, mine]) and torch.equal(grad, joined_chunks)
        output, grad = result["mappings"]["sequence_gather"]
        assert torch.equal(output, joined_chunks) and torch.equal(grad, summed_full[:, mine])
        output, grad = result["mappings"]["sequence_reduce_scatter"]
        assert torch.equal(output, summed_full[:, mine]) and torch.equal(grad, joined_chunks)
    # Spot check by hand: rank 1's gathered sequence position 2, batch 0 is its own first row: 100, 101, 102.
    assert two_ranks[1]["mappings"]["sequence_gather"][0][0, 2].tolist() == [100.0, 101.0, 102.0]


# --- layers against torch --------------------------------------------------------------------------------

def reference(module, inputs, upstream):
    inputs = inputs.clone().requires_grad_(True)
    module.zero_grad()
    output = module(inputs)
    output.backward(upstream)
    return output.detach(), inputs.grad, module.weight.grad.clone(), module.bias.grad.clone()


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_column_parallel_linear_matches_torch(two_ranks, sequence_parallel):
    output, input_grad, weight_grad, bias_grad = reference(*two_ranks[0]["column_case"])
    for rank, result in enumerate(two_ranks):
        rows, seq = slice(4 * rank, 4 * rank + 4), slice(2 * rank, 2 * rank + 2)
        got_output, got_input_grad, got_weight_grad, got_bias_grad = result["layers"][("column", sequence_parallel)]
        assert torch.allclose(got_output, output[..., rows], atol=1e-6)
        assert torch.allclose(got_input_grad, input_grad[:, seq] if sequence_parallel else input_grad, atol=1e-6)
        assert torch.allclose(got_weight_grad, weight_grad[rows], atol=1e-5)
        assert torch.allclose(got_bias_grad, bias_grad[rows], atol=1e-5)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_row_parallel_linear_matches_torch(two_ranks, sequence_parallel):
    output, input_grad, weight_grad, bias_grad = reference(*two_ranks[0]["row_case"])
    for rank, result in enumerate(two_ranks):
        columns, seq = slice(4 * rank, 4 * rank + 4), slice(2 * rank, 2 * rank + 2)
        got_output, got_input_grad, got_weight_grad, got_bias_grad, marked = \
            result["layers"][("row", sequence_parallel)]
        assert torch.allclose(got_output, output[:, seq] if sequence_parallel else output, atol=1e-5)
        assert torch.allclose(got_input_grad, input_grad[..., columns], atol=1e-6)
        assert torch.allclose(got_weight_grad, weight_grad[:, columns], atol=1e-5)
        # The bias is added once, after the reduction; with sequence parallelism its gradient (from this rank's
        # tokens only) is summed over the ranks at the end of the step, giving the full-sequence gradient.
        assert torch.allclose(got_bias_grad, bias_grad, atol=1e-5)
        assert marked == sequence_parallel
        assert result["layers"]["row_weight_marks"] == (True, 1, 0)


def test_vocab_parallel_embedding_matches_torch(two_ranks):
    weight, ids, upstream = two_ranks[0]["embedding"]["inputs"][:3]
    full_weight = weight.clone().requires_grad_(True)
    expected = F.embedding(ids, full_weight)
    expected.backward(upstream)
    for rank, result in enumerate(two_ranks):
        output, weight_grad = result["embedding"]["embedding"]
        assert torch.equal(output, expected.detach())  # one rank contributes each row, the other zeros
        assert torch.equal(weight_grad, full_weight.grad[4 * rank:4 * rank + 4])
    assert two_ranks[0]["embedding"]["vocab"] == 8


def test_vocab_parallel_cross_entropy_matches_torch_including_padded_rows(two_ranks):
    _, _, _, logits, labels, loss_weights = two_ranks[0]["embedding"]["inputs"]
    full_logits = logits.clone().requires_grad_(True)
    expected = F.cross_entropy(full_logits.flatten(0, 1), labels.flatten(), reduction="none").view(2, 4)
    (expected * loss_weights).sum().backward()
    assert torch.isfinite(expected).all()
    for rank, result in enumerate(two_ranks):
        losses, logits_grad = result["embedding"]["cross_entropy"]
        assert torch.allclose(losses, expected.detach(), atol=1e-5)
        assert torch.allclose(logits_grad, full_logits.grad[..., 4 * rank:4 * rank + 4], atol=1e-6)
        assert result["embedding"]["bf16_dtype"] == torch.float32


def test_input_errors_say_what_to_change(two_ranks):
    sequence, column, embedding = two_ranks[0]["errors"]
    assert "sequence length 3" in sequence and "--tensor-model-parallel-size 2" in sequence
    assert "--seq-length" in sequence
    assert column.startswith("output features 5 is not divisible by --tensor-model-parallel-size 2")
    assert embedding.startswith("padded vocabulary size 7 is not divisible by --tensor-model-parallel-size 2")


# --- sequence-parallel gradients, summed once per step -----------------------------------------------------

def test_sequence_parallel_gradients_are_summed_over_the_ranks_once_per_step(two_ranks):
    def gradients(rank, micro_batch):
        norm = torch.nn.LayerNorm(3)
        inputs, upstream = layer_norm_micro_batch(rank, micro_batch)
        norm(inputs).backward(upstream)
        return norm.weight.grad, norm.bias.grad

    step = [sum(parts) for parts in zip(*(gradients(rank, mb) for rank in range(2) for mb in range(2)))]
    for rank, result in enumerate(two_ranks):
        after_first, after_second = result["gradient_sum"][0]
        for got, own in zip(after_first, gradients(rank, 0)):
            assert torch.equal(got, own)  # mid-step: this rank's chunk only, nothing communicated yet
        for got, expected in zip(after_second, step):
            assert torch.allclose(got, expected, atol=1e-6)  # both ranks' chunks of both micro-batches
    assert not torch.allclose(two_ranks[0]["gradient_sum"][0][0][0], two_ranks[1]["gradient_sum"][0][0][0])
    assert "accumulated a second gradient before the others" in two_ranks[0]["gradient_sum"][1]


# --- RNG tracker (single process: a tracker is per process) ------------------------------------------------

def test_fork_draws_from_the_named_stream_and_leaves_the_default_alone():
    torch.manual_seed(5)
    tracker = tp.tensor_parallel_rng_tracker(seed=5, tensor_parallel_rank=1)
    default_state = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(4)
    with tracker.fork():
        second = torch.rand(4)  # continues the stream rather than restarting it
    assert torch.equal(torch.get_rng_state(), default_state)
    stream = torch.Generator().manual_seed(5 + 2718 + 1)  # Megatron's model-parallel seed for TP rank 1
    assert torch.equal(torch.cat([first, second]), torch.rand(8, generator=stream))
    other_rank = tp.tensor_parallel_rng_tracker(seed=5, tensor_parallel_rank=0)
    with other_rank.fork():
        assert not torch.equal(torch.rand(4), first)


def test_tracker_states_round_trip_and_misuse():
    tracker = tp.tensor_parallel_rng_tracker(seed=1, tensor_parallel_rank=0)
    saved = tracker.get_states()
    with tracker.fork():
        drawn = torch.rand(3)
    tracker.set_states(saved)
    with tracker.fork():
        assert torch.equal(torch.rand(3), drawn)
    with pytest.raises(ValueError, match="already exists"):
        tracker.add(tp.MODEL_PARALLEL_RNG, 3)
    with pytest.raises(KeyError, match="never added"):
        with tracker.fork("data-parallel"):
            pass


def test_checkpoint_recomputes_the_same_forked_dropout_masks():
    tracker = tp.tensor_parallel_rng_tracker(seed=2, tensor_parallel_rank=0)
    forked_dropout, plain_dropout = tp.RNGForkedDropout(0.5, tracker), torch.nn.Dropout(0.5)
    masks = []

    def block(hidden):
        hidden = forked_dropout(hidden * 3.0)
        # Recorded before the last op: torch stops a recomputation once it has the tensors backward needs.
        masks.append(hidden != 0)
        return plain_dropout(hidden)  # a second mask, from the default stream

    start_states, start_default = tracker.get_states(), torch.get_rng_state()
    inputs = torch.ones(64, requires_grad=True)
    tracker.checkpoint(block, inputs).sum().backward()
    after_checkpoint = tracker.get_states()
    assert len(masks) == 2 and torch.equal(masks[0], masks[1])  # forward, then recomputation: same masks
    assert 0 < masks[0].sum() < 64

    tracker.set_states(start_states)
    torch.set_rng_state(start_default)
    plain_inputs = torch.ones(64, requires_grad=True)
    block(plain_inputs).sum().backward()
    # Same forked mask and, since the gradient is the product of both masks, the same default-stream mask.
    assert torch.equal(masks[2], masks[0]) and torch.equal(inputs.grad, plain_inputs.grad)
    # The recomputation rewound the stream only for itself: afterwards it is where the forward left it.
    assert all(torch.equal(state, tracker.get_states()[name]) for name, state in after_checkpoint.items())
