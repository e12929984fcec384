"""Tensor and sequence parallelism applied to a built GPTModel (or to the pieces of a pipeline stage) from
outside, by swapping its pieces in place.

Build the model with the same seed on every rank, then call apply_tensor_parallel: each linear, the word
embedding, the LM head and the loss are replaced by tensor-parallel versions holding this rank's shard of the
very same weights, so the result computes what the single-process model computes.

What changes where (TP = tensor-parallel group):
  word embedding           VocabParallelEmbedding (vocabulary rows split; output all-reduced)
  query_key_value, h_to_4h ColumnParallelLinear (output features split: whole heads / ffn columns)
  attention.dense, 4h_to_h RowParallelLinear (input features split; output all-reduced or reduce-scattered)
  attention kernel         runs in the model-parallel random stream (each rank's heads drop out differently)
  LM head + loss           vocab-split logits and vocab-parallel cross entropy (full logits never exist)
With sequence_parallel, activations between the TP regions are split along the sequence: the embedding
output is scattered, LayerNorms and dropout run on the local chunk (dropout in the model-parallel stream),
the column-parallel linears and the LM head gather the sequence, the row-parallel ones reduce-scatter it.
Parameters that are replicated but see only local tokens (LayerNorms, row-parallel biases) are marked
`sequence_parallel=True` and sum their gradients over TP through hooks, so no training-loop call is needed.
"""
from collections import OrderedDict
from typing import Dict, List

import torch
import torch.distributed as dist
from deepspeed.pipe import PipelineModule
from torch import nn

from megatron.errors import InputError
from megatron.model.gpt import (MLP, Embedding, GPTModel, LanguageModelLoss, LMHead, SelfAttention, TransformerLayer,
                                masked_mean)
from megatron.tensor_parallel import (ColumnParallelLinear, RNGForkedDropout, RNGStatesTracker, RowParallelLinear,
                                      VocabParallelEmbedding, column_parallel_linear, mark_sequence_parallel,
                                      scatter_to_sequence_parallel_region, vocab_parallel_cross_entropy)


class RNGForkedAttention:
    """An attention kernel run inside the model-parallel random stream: attention-probability dropout acts on
    this rank's heads only, so its masks must differ from the other ranks'."""

    def __init__(self, kernel, rng_tracker: RNGStatesTracker):
        self.kernel, self.rng_tracker = kernel, rng_tracker

    def __call__(self, query, key, value, attention_mask, dropout_p):
        with self.rng_tracker.fork():
            return self.kernel(query, key, value, attention_mask, dropout_p)


class ScatterToSequenceParallelRegion(nn.Module):
    def __init__(self, group):
        super().__init__()
        self.group = group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return scatter_to_sequence_parallel_region(hidden, self.group)


class VocabParallelLMHead(nn.Module):
    """The tied LM head against this rank's vocabulary rows: logits [batch, seq, vocab / TP]."""

    def __init__(self, group, sequence_parallel: bool):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel

    def forward(self, hidden: torch.Tensor, word_embedding_weight: torch.Tensor) -> torch.Tensor:
        return column_parallel_linear(hidden, word_embedding_weight, None, self.group, self.sequence_parallel)


class VocabParallelLanguageModelLoss(nn.Module):
    """LanguageModelLoss for vocab-split logits; the same value on every tensor-parallel rank."""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def forward(self, logits, labels, loss_mask=None):
        return masked_mean(vocab_parallel_cross_entropy(logits, labels, self.group), loss_mask)


def check_divisible_by_tensor_parallel_size(pieces: List[nn.Module], tp_size: int) -> None:
    """Raise InputError, before anything is swapped, if a piece cannot be split evenly over tp_size ranks."""
    for piece in pieces:
        if isinstance(piece, SelfAttention):
            what, value, fix = ("--num-attention-heads", piece.num_heads, "each rank must hold whole attention heads")
        elif isinstance(piece, MLP):
            what, value, fix = ("--ffn-hidden-size", piece.dense_h_to_4h.out_features,
                                "choose an FFN size divisible by it")
        elif isinstance(piece, Embedding):
            what, value, fix = ("the padded vocabulary size", piece.word_embeddings.num_embeddings,
                                "pad the vocabulary with megatron.tokenizer.vocab_size_with_padding(..., "
                                "tensor_model_parallel_size)")
        else:
            continue
        if value % tp_size:
            raise InputError(f"{what} {value} is not divisible by --tensor-model-parallel-size {tp_size}; {fix}")


def apply_tensor_parallel(model: nn.Module, parallel_state, sequence_parallel: bool = False, *,
                          rng_tracker: RNGStatesTracker) -> nn.Module:
    """Shard every GPT piece inside `model` in place (and return it): a whole GPTModel, or a single piece as a
    pipeline stage builds it (model/pipe.py), so both share this one set of swaps.

    rng_tracker: from tensor_parallel_rng_tracker(seed, tp_rank); dropout in TP / SP regions draws from it and
    activation recomputation rewinds it. Its states belong in checkpoints next to torch's.
    """
    group = parallel_state.get_tensor_model_parallel_group()
    modules = list(model.modules())
    if any(isinstance(module, (VocabParallelEmbedding, ColumnParallelLinear)) for module in modules):
        raise ValueError("apply_tensor_parallel was already applied to this model")
    check_divisible_by_tensor_parallel_size(modules, dist.get_world_size(group))

    def column(linear):
        return ColumnParallelLinear(linear.weight, linear.bias, group, sequence_parallel)

    def row(linear):
        return RowParallelLinear(linear.weight, linear.bias, group, sequence_parallel)

    def mark_layer_norm(layer_norm):
        for parameter in layer_norm.parameters():
            mark_sequence_parallel(parameter, group)

    def shard_embedding(embedding: Embedding):
        embedding.word_embeddings = VocabParallelEmbedding(embedding.word_embeddings.weight, group)
        if sequence_parallel:
            embedding.dropout = nn.Sequential(OrderedDict(
                scatter_to_sequence_chunks=ScatterToSequenceParallelRegion(group),
                dropout=RNGForkedDropout(embedding.dropout.p, rng_tracker)))

    def shard_layer(layer: TransformerLayer):
        attention, mlp = layer.attention, layer.mlp
        attention.query_key_value, attention.dense = column(attention.query_key_value), row(attention.dense)
        attention.attend = RNGForkedAttention(attention.attend, rng_tracker)
        mlp.dense_h_to_4h, mlp.dense_4h_to_h = column(mlp.dense_h_to_4h), row(mlp.dense_4h_to_h)
        if sequence_parallel:
            layer.dropout = RNGForkedDropout(layer.dropout.p, rng_tracker)
            mark_layer_norm(layer.input_layernorm)
            mark_layer_norm(layer.post_attention_layernorm)

    for module in modules:
        if isinstance(module, Embedding):
            shard_embedding(module)
        elif isinstance(module, TransformerLayer):
            shard_layer(module)
        # The final LayerNorm goes by this attribute name in GPTModel and in the pipeline's final piece.
        if sequence_parallel and hasattr(module, "final_layernorm"):
            mark_layer_norm(module.final_layernorm)
        for name, child in list(module.named_children()):
            if isinstance(child, LMHead):
                setattr(module, name, VocabParallelLMHead(group, sequence_parallel))
            elif isinstance(child, LanguageModelLoss):
                setattr(module, name, VocabParallelLanguageModelLoss(group))
    if isinstance(model, GPTModel):
        model.checkpoint_layer = rng_tracker.checkpoint
    return model


def _join_tensor_parallel_shards(model: nn.Module, parallel_state) -> Dict[str, torch.Tensor]:
    group = parallel_state.get_tensor_model_parallel_group()
    world_size = dist.get_world_size(group)
    full = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        local = tensor.detach().contiguous()
        if getattr(tensor, "tensor_model_parallel", False) and world_size > 1:
            shards = [torch.empty_like(local) for _ in range(world_size)]
            dist.all_gather(shards, local, group=group)
            full[name] = torch.cat(shards, dim=tensor.partition_dim)
        else:
            full[name] = local.clone()
    return full


def gather_full_state_dict(model: nn.Module, parallel_state) -> Dict[str, torch.Tensor]:
    """The single-process GPTModel's state dict, rebuilt on every rank by joining the tensor-parallel shards
    and, for a pipeline stage, collecting every stage's pieces under GPTModel's names (a collective: every
    rank of the model's groups must call it)."""
    full = _join_tensor_parallel_shards(model, parallel_state)
    if isinstance(model, PipelineModule):  # model/pipe.py's GPTPipe: it knows its stages' names
        return model.single_process_state_dict(full, parallel_state.get_pipeline_model_parallel_group())
    return full
