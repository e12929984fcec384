"""DeepSpeed-Ulysses sequence parallelism (--ds-sequence-parallel-size N), applied to GPTModel from outside.

Each of the N ranks of a sequence-parallel group holds one contiguous chunk of every sequence (the batch is cut in
data/gpt_batch.py) and runs every layer on it, except the attention core: there DeepSpeed's own
`deepspeed.sequence.layer.DistributedAttention` exchanges queries, keys and values by all-to-all so that each rank
attends over the whole sequence with 1/N of the heads, and exchanges the context back. The weights are whole on
every rank (SP shards no parameter), so DeepSpeed reduces their gradients over the data- and sequence-parallel
ranks together (parallel_state's sequence-data-parallel group) and divides by the data-parallel size only, as
upstream Megatron-DeepSpeed main does.

What this changes on the model, piece by piece (prepare(piece, path), like the tensor-parallel sharder):
- each SelfAttention: the attention core becomes DeepSpeed's all-to-all attention around the same kernel, and
  rotary positions start at this rank's chunk (learned positions come from the batch's sliced position ids);
- the loss: the mean over the whole sequence's tokens, not over this rank's chunk, the same value on every rank
  of the group. Each rank's backward then carries only its own tokens' share, so the sum over the group that
  DeepSpeed takes is the one-process gradient (upstream's vocab_sequence_parallel_cross_entropy gathers the
  per-token losses for the same reason).
"""
import torch
import torch.distributed as dist
from deepspeed.sequence.layer import DistributedAttention

from megatron.model.cross_entropy import cross_entropy
from megatron.model.gpt import LanguageModelLoss, SelfAttention, TransformerLayer
from megatron.model.kernels import repeats_grouped_kv
from megatron.tensor_parallel.mappings import reduce_from_tensor_parallel_region

# Our heads tensors are [batch, heads, seq, head_dim]; DeepSpeed's all-to-all takes [batch, seq, heads, head_dim]
# (batch dim 0): it scatters the heads (dim 2) and gathers the sequence (dim 1), and the reverse afterwards.
BATCH_DIM, SEQUENCE_DIM, HEADS_DIM = 0, 1, 2


class _LocalCore:
    """The layer's own attention kernel on [batch, seq, heads, head_dim] tensors, as DistributedAttention calls it:
    the whole sequence, this rank's heads. Grouped key/value heads that arrive unrepeated are repeated here, after
    the all-to-all, unless the kernel takes them grouped."""

    def __init__(self, attend):
        self.attend = attend

    def __call__(self, query, key, value, spec):
        queries_per_group = query.shape[HEADS_DIM] // key.shape[HEADS_DIM]
        if queries_per_group > 1 and repeats_grouped_kv(self.attend):
            key, value = (t.repeat_interleave(queries_per_group, dim=HEADS_DIM) for t in (key, value))
        context = self.attend(*(t.transpose(1, 2) for t in (query, key, value)), spec)
        return context.transpose(1, 2)


class UlyssesAttention:
    """An attention kernel (model/kernels.py's contract: [batch, heads, seq chunk, head_dim] in and out) that
    attends over the whole sequence through DeepSpeed's DistributedAttention. The spec's segment_ids cover the
    whole sequence (the batch keeps them whole while it cuts the tokens), as the core attends over all of it. With
    `takes_grouped_kv` (the key/value heads divide among the group's ranks: `key_value_heads` a multiple of its size)
    grouped-query key and value cross the all-to-all with their own heads, not repeated to the query's: each rank's
    block of query heads is served by its block of key/value heads, so the exchange moves no repeated bytes."""

    def __init__(self, attend, group, key_value_heads: int):
        self.distributed = DistributedAttention(_LocalCore(attend), group, scatter_idx=HEADS_DIM,
                                                gather_idx=SEQUENCE_DIM)
        self.takes_grouped_kv = key_value_heads % dist.get_world_size(group) == 0

    def __call__(self, query, key, value, spec):
        query, key, value = (t.transpose(1, 2).contiguous() for t in (query, key, value))
        context = self.distributed(query, key, value, BATCH_DIM, None, spec)
        return context.transpose(1, 2)


class SequenceParallelLoss(LanguageModelLoss):
    """LanguageModelLoss over the whole sequence: the masked token losses of this rank's chunk summed and divided
    by the group's token count, then summed over the group (an all-reduce whose backward is the identity, so each
    rank's gradient is its own tokens' share)."""

    def __init__(self, chunk_bytes: int, chunk_kernels, group):
        super().__init__(chunk_bytes, chunk_kernels)
        self.sequence_group = group

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, loss_mask=None) -> torch.Tensor:
        token_losses = cross_entropy(logits, labels, self.vocab_group, self.chunk_bytes, self.chunk_kernels,
                                     overwrite_logits=True).flatten()
        weights = torch.ones_like(token_losses) if loss_mask is None else loss_mask.flatten().float()
        count = reduce_from_tensor_parallel_region(weights.sum().detach(), self.sequence_group)
        return reduce_from_tensor_parallel_region((token_losses * weights).sum() / count, self.sequence_group)


def ulysses_pieces(prepare, parallel_state):
    """prepare(piece, path) that applies `prepare` (e.g. the tensor-parallel sharder) and then sequence
    parallelism; `prepare` itself where the sequence-parallel size is 1."""
    if parallel_state is None or parallel_state.get_sequence_parallel_world_size() == 1:
        return prepare
    group, rank = parallel_state.get_sequence_parallel_group(), parallel_state.get_sequence_parallel_rank()

    def prepare_for_sequence_parallel(piece, path: str):
        piece = prepare(piece, path)
        if isinstance(piece, TransformerLayer):
            attention: SelfAttention = piece.self_attention
            attention.attend = UlyssesAttention(attention.attend, group, attention.num_groups)
            attention.sequence_chunk_index = rank
        elif isinstance(piece, LanguageModelLoss):
            whole_sequence = SequenceParallelLoss(piece.chunk_bytes, piece.chunk_kernels, group)
            whole_sequence.vocab_group = piece.vocab_group
            piece = whole_sequence
        return piece
    return prepare_for_sequence_parallel
