"""The GPT model's tensor-parallel plan, applied from outside to a built GPTModel or to the pieces of a
pipeline stage, and the gathering of full weights that the same plan drives.

Build the model with the same seed on every rank and shard each piece by the plan as soon as it is built
(piece_sharder, GPTModel's `prepare`), or call apply_tensor_parallel on a whole model: the plan below names, by
path in GPTModel, what each module becomes; every split module keeps this rank's shard of the very same
weights, so the result computes what the single-process model computes.

  embedding.word_embeddings      vocabulary rows split; output all-reduced
  layers.*.self_attention        whole query groups (with their key/value heads) per rank; the attention kernel
                                 runs in the model-parallel random stream (each rank's heads drop out differently)
  self_attention.q_norm / k_norm whole on every rank, applied to its heads: gradients summed over the ranks in
                                 each backward pass (--qk-layernorm)
  query_key_value, dense_h_to_4h column-parallel (output features split; a SwiGLU MLP's dense_h_to_4h,
                                 [gate; up], split half by half: a rank holds [gate_r; up_r], upstream's order)
  self_attention.dense, dense_4h_to_h row-parallel (input features split; output all-reduced or reduce-scattered)
  lm_head, loss                  vocab-split logits (an untied head's own weight split by vocabulary rows) and
                                 vocab-parallel cross entropy (full logits never exist)
  ...deepspeed_experts.*.        with --enable-expert-tensor-parallelism only (GPT_EXPERT_TENSOR_PARALLEL_PLAN): each
    dense_h_to_4h / dense_4h_to_h  expert of an MoE layer split as the dense MLP is; they keep DeepSpeed's
                                 expert marks, so its expert-data-parallel gradient reduction still takes them
  layers.*.mlp.mlp.*             PR-MoE's dense MLP beside the experts, split with them (as upstream) under the same
                                 flag; without it every tensor-parallel rank holds it whole
With sequence_parallel, activations between the tensor-parallel regions are split along the sequence: the
embedding's dropout first scatters it, LayerNorms and dropout run on the local chunk (dropout in the
model-parallel stream), the column-parallel linears and the LM head gather the sequence, the row-parallel ones
reduce-scatter it. Parameters replicated but seeing only local tokens (LayerNorms, row-parallel biases) are
marked `sequence_parallel`; the training loop sums their gradients over the tensor-parallel group once per step
(megatron.tensor_parallel.sum_sequence_parallel_gradients_each_step).
"""
from types import MappingProxyType
from typing import Optional

import torch
from torch import nn

from megatron.model.gpt import MLP, GPTModel, LanguageModelLoss, LMHead, SelfAttention, keep_whole
from megatron.model.kernels import repeats_grouped_kv
from megatron.tensor_parallel import RNGStatesTracker, column_parallel_linear, shard_parameter
from megatron.tensor_parallel.plan import (ColumnParallel, ParallelStyle, RowParallel, SequenceChunkingDropout,
                                           SequenceParallel, SequenceParallelDropout, ShardingContext,
                                           SharedOverHeads, Split, VocabParallel, parallelize_module, partition_dim,
                                           require_divisible_by_tp)


class RNGForkedAttention:
    """An attention kernel run inside the model-parallel random stream: attention-probability dropout acts on
    this rank's heads only, so its masks must differ from the other ranks'. It takes grouped key/value heads
    where its kernel does, so tensor parallelism repeats none the kernel would not."""

    def __init__(self, kernel, rng_tracker: RNGStatesTracker):
        self.kernel, self.rng_tracker = kernel, rng_tracker
        self.takes_grouped_kv = not repeats_grouped_kv(kernel)

    def __call__(self, query, key, value, spec):
        with self.rng_tracker.fork():
            return self.kernel(query, key, value, spec)


class VocabParallelLMHead(nn.Module):
    """The LM head against this rank's vocabulary rows: logits [batch, seq, vocab / TP]. Tied, the rows are the
    word embedding's shard passed in; untied, `weight` is this rank's rows of the head's own."""

    def __init__(self, group, sequence_parallel: bool, weight: Optional[torch.Tensor]):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = None if weight is None else shard_parameter(weight, 0, group, "vocabulary rows")

    def forward(self, hidden: torch.Tensor, word_embedding_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        weight = word_embedding_weight if self.weight is None else self.weight
        return column_parallel_linear(hidden, weight, None, self.group, self.sequence_parallel)


class HeadParallelAttention(ParallelStyle):
    """SelfAttention whose projections hand each rank whole query groups (whole heads without grouped-query
    attention)."""
    expected_type = SelfAttention

    def check(self, module, path, world_size):
        super().check(module, path, world_size)
        require_divisible_by_tp(module.num_heads, world_size, "--num-attention-heads",
                                "each rank must hold whole attention heads")
        require_divisible_by_tp(module.num_groups, world_size, "--num-key-value-heads",
                                "each rank must hold whole query groups; lower the tensor-parallel size to a "
                                "divisor of the key/value heads")

    def apply(self, module, context):
        module.attend = RNGForkedAttention(module.attend, context.rng_tracker)
        return module


class VocabParallelHead(ParallelStyle):
    expected_type = LMHead
    partition_dims = {"weight": Split(0)}  # an untied head's own weight

    def apply(self, module, context):
        return VocabParallelLMHead(context.group, context.sequence_parallel, module.weight)


class VocabParallelLoss(ParallelStyle):
    expected_type = LanguageModelLoss

    def apply(self, module, context):
        module.vocab_group = context.group  # the loss is then the same on every tensor-parallel rank
        return module


class RecomputeWithTrackedStreams(ParallelStyle):
    """The whole GPTModel: activation recomputation must also rewind the tracker's random streams."""
    expected_type = GPTModel

    def apply(self, module, context):
        module.checkpoint_layer = context.rng_tracker.checkpoint
        return module


_FFN = ("--ffn-hidden-size", "choose an FFN size divisible by it")

# Paths are GPTModel's; a pipeline stage applies the plan to each piece at the piece's path (model/pipe.py).
GPT_TENSOR_PARALLEL_PLAN = MappingProxyType({
    "": RecomputeWithTrackedStreams(),
    "embedding.word_embeddings": VocabParallel(),
    "embedding.dropout": SequenceChunkingDropout(),
    "layers.*.input_layernorm": SequenceParallel(),
    "layers.*.self_attention": HeadParallelAttention(),
    "layers.*.self_attention.query_key_value": ColumnParallel(),
    "layers.*.self_attention.dense": RowParallel(),
    "layers.*.self_attention.q_norm": SharedOverHeads(),
    "layers.*.self_attention.k_norm": SharedOverHeads(),
    "layers.*.post_attention_layernorm": SequenceParallel(),
    "layers.*.mlp.dense_h_to_4h": ColumnParallel(*_FFN),
    "layers.*.mlp.dense_4h_to_h": RowParallel(*_FFN),
    "layers.*.dropout": SequenceParallelDropout(),
    "final_layernorm": SequenceParallel(),
    "lm_head": VocabParallelHead(),
    "loss": VocabParallelLoss(),
})


class KeepsExpertMarks:
    """Mixed into a linear style for an expert: the split parameters keep the attributes DeepSpeed's Experts set
    on the whole ones (`allreduce` False, `group_name`), by which its engine reduces their gradients over the
    expert-data-parallel group only and its MoE parameter groups find them."""
    MARKS = ("allreduce", "group_name")

    def apply(self, module, context):
        replacement = super().apply(module, context)
        for name, parameter in replacement.named_parameters(recurse=False):
            for mark in self.MARKS:
                if hasattr(getattr(module, name), mark):
                    setattr(parameter, mark, getattr(getattr(module, name), mark))
        return replacement


class ExpertColumnParallel(KeepsExpertMarks, ColumnParallel):
    pass


class ExpertRowParallel(KeepsExpertMarks, RowParallel):
    pass


_EXPERTS = "layers.*.mlp.deepspeed_moe.experts.deepspeed_experts.*"  # model/moe.py: DeepSpeed's names, local index
_RESIDUAL = "layers.*.mlp.mlp"  # PR-MoE's dense MLP beside the experts (DeepSpeed's MoE.mlp)
GPT_EXPERT_TENSOR_PARALLEL_PLAN = MappingProxyType({
    **GPT_TENSOR_PARALLEL_PLAN,
    f"{_EXPERTS}.dense_h_to_4h": ExpertColumnParallel(*_FFN),
    f"{_EXPERTS}.dense_4h_to_h": ExpertRowParallel(*_FFN),
    f"{_RESIDUAL}.dense_h_to_4h": ColumnParallel(*_FFN),  # split as upstream's ParallelMLP(moe=True) expert copy;
    f"{_RESIDUAL}.dense_4h_to_h": RowParallel(*_FFN),  # dense: its gradient is reduced over data-parallel ranks
})


def gpt_plan(experts: bool = False, swiglu: bool = False):
    """The GPT plan: with `experts` the experts split too (GPT_EXPERT_TENSOR_PARALLEL_PLAN); with `swiglu` every
    MLP's dense_h_to_4h holds [gate; up] and is split half by half (Split blocks 2)."""
    plan = GPT_EXPERT_TENSOR_PARALLEL_PLAN if experts else GPT_TENSOR_PARALLEL_PLAN
    if not swiglu:
        return plan
    return MappingProxyType({pattern: type(style)(style.what, style.fix, blocks=2)
                             if pattern.endswith(".dense_h_to_4h") else style for pattern, style in plan.items()})


def tensor_parallel_partition_dim(name: str, experts: bool = False, swiglu: bool = False) -> Optional[Split]:
    """For a parameter's full name in GPTModel (e.g. 'layers.3.self_attention.dense.weight'), how tensor
    parallelism splits it over the ranks (its Split: the dim, and the blocks cut separately), or None where every
    rank holds all of it. Splitting a full checkpoint into tensor-parallel shards (megatron.tensor_parallel.shard_of)
    and joining them back both follow this rule. `experts`: the model's experts are split too
    (--enable-expert-tensor-parallelism); `swiglu`: the model's MLPs are SwiGLU's (--swiglu)."""
    return partition_dim(gpt_plan(experts, swiglu), name)


def gated(module: nn.Module) -> bool:
    """Whether `module` (a model or a piece of one) has SwiGLU MLPs, whose dense_h_to_4h the plan splits by halves."""
    return any(isinstance(sub, MLP) and sub.swiglu is not None for sub in module.modules())


def apply_tensor_parallel(module: nn.Module, parallel_state, sequence_parallel: bool = False, *,
                          rng_tracker: RNGStatesTracker, path: str = "", experts: bool = False) -> nn.Module:
    """Shard `module` by the GPT plan in place and return what takes its place: a whole GPTModel (path ""), or a
    pipeline stage's piece at its path in GPTModel (model/pipe.py), so both share this one plan.

    rng_tracker: from tensor_parallel_rng_tracker(seed, tp_rank); dropout in TP / SP regions draws from it and
    activation recomputation rewinds it. Its states belong in checkpoints next to torch's. With
    sequence_parallel, whoever trains the module must sum the marked gradients
    (megatron.tensor_parallel.sum_sequence_parallel_gradients_each_step). `experts`: split the MoE layers'
    experts too (GPT_EXPERT_TENSOR_PARALLEL_PLAN). SwiGLU MLPs, which the module itself shows (gated), have
    their [gate; up] rows split half by half.
    """
    context = ShardingContext(parallel_state.get_tensor_model_parallel_group(), sequence_parallel, rng_tracker)
    return parallelize_module(module, gpt_plan(experts, gated(module)), context, path)


def piece_sharder(parallel_state, sequence_parallel: bool, rng_tracker: RNGStatesTracker):
    """prepare(piece, path) for GPTModel and model/pipe.py's pieces: each piece sharded by the plan at its GPTModel
    path as soon as it is built, so a rank holds its shard plus at most one whole piece, never the whole model;
    the values are those of sharding the whole model afterwards. Without process groups (None) pieces stay whole."""
    if parallel_state is None or parallel_state.get_tensor_model_parallel_world_size() == 1:
        return keep_whole

    def prepare(piece: nn.Module, path: str) -> nn.Module:
        return apply_tensor_parallel(piece, parallel_state, sequence_parallel, rng_tracker=rng_tracker, path=path)
    return prepare
