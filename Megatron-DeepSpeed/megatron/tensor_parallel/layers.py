"""Tensor-parallel layers built from a FULL weight: each rank keeps its shard.

Building each piece of the model identically on every rank (same seed) and then slicing it means a
tensor-parallel model starts from exactly the single-process weights, so parity is exact and the model code needs no
knowledge of parallelism ("parallelize from outside"). Sharded parameters carry `tensor_model_parallel=True`
and `partition_dim`, the attributes DeepSpeed's gradient-norm code reads.
"""
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from megatron.errors import require_divisible
from megatron.tensor_parallel.mappings import (copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                                               reduce_from_tensor_parallel_region,
                                               reduce_scatter_to_sequence_parallel_region)
from megatron.tensor_parallel.random import MODEL_PARALLEL_RNG, RNGStatesTracker
from megatron.tensor_parallel.sequence_parallel_grads import mark_sequence_parallel


def shard_of(full: torch.Tensor, dim: int, rank: int, world_size: int, what: str = "size",
             blocks: int = 1) -> torch.Tensor:
    """Rank `rank`'s equal slice of `full` along `dim`, of `world_size` slices (a view). With `blocks` > 1, `dim`
    holds that many equal consecutive blocks, each sliced so: the rank's slices of every block, in block order (a
    SwiGLU MLP's [gate; up] rows give rank r [gate_r; up_r], as upstream Megatron-DeepSpeed cuts them)."""
    blocked = full.unflatten(dim, (blocks, -1))
    require_divisible(what, blocked.shape[dim + 1], "--tensor-model-parallel-size", world_size,
                      "choose a tensor-parallel size that divides it")
    size = blocked.shape[dim + 1] // world_size
    return blocked.narrow(dim + 1, rank * size, size).flatten(dim, dim + 1)


def shard_parameter(full: torch.Tensor, dim: int, group, what: str, blocks: int = 1) -> nn.Parameter:
    """This rank's equal slice of `full` along `dim` (of each of its `blocks`: shard_of), as a parameter marked
    tensor-parallel."""
    shard = shard_of(full.detach(), dim, dist.get_rank(group), dist.get_world_size(group), what, blocks)
    parameter = nn.Parameter(shard.clone())
    parameter.tensor_model_parallel = True
    parameter.partition_dim = dim
    parameter.partition_stride = 1
    return parameter


def column_parallel_linear(hidden, weight, bias, group, sequence_parallel: bool):
    """y_shard = x W_shard^T + b_shard, where W is split by output rows. The input is replicated (or, with
    sequence parallelism, this rank's sequence chunk, gathered first); its gradient is partial per rank."""
    if sequence_parallel:
        hidden = gather_from_sequence_parallel_region(hidden, group)
    else:
        hidden = copy_to_tensor_parallel_region(hidden, group)
    return F.linear(hidden, weight, bias)


class ColumnParallelLinear(nn.Module):
    """Linear layer whose output features are split across TP ranks; output stays split (e.g. whole heads)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], group, sequence_parallel: bool = False,
                 blocks: int = 1):
        """`blocks`: the output features are that many blocks, each split over the ranks (shard_of)."""
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = shard_parameter(weight, 0, group, "output features", blocks)
        self.bias = None if bias is None else shard_parameter(bias, 0, group, "output features", blocks)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return column_parallel_linear(hidden, self.weight, self.bias, self.group, self.sequence_parallel)

    def extra_repr(self) -> str:
        return (f"in_features={self.weight.shape[1]}, local_out_features={self.weight.shape[0]}, "
                f"sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """Linear layer whose input features are split across TP ranks (its input is a column-parallel output).
    The partial products are summed (all-reduce, or reduce-scatter along the sequence with sequence
    parallelism) and only then is the replicated bias added, so it is counted once."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], group, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = shard_parameter(weight, 1, group, "input features")
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        if self.bias is not None and sequence_parallel:
            mark_sequence_parallel(self.bias)  # added to this rank's sequence chunk only

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        partial = F.linear(hidden, self.weight)
        if self.sequence_parallel:
            output = reduce_scatter_to_sequence_parallel_region(partial, self.group)
        else:
            output = reduce_from_tensor_parallel_region(partial, self.group)
        return output if self.bias is None else output + self.bias

    def extra_repr(self) -> str:
        return (f"local_in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}, "
                f"sequence_parallel={self.sequence_parallel}")


class VocabParallelEmbedding(nn.Module):
    """Embedding whose (padded) vocabulary rows are split across TP ranks. Each rank looks up the ids in its
    range, contributes zeros for the others, and an all-reduce assembles the full embedding."""

    def __init__(self, weight: torch.Tensor, group):
        super().__init__()
        self.group = group
        self.weight = shard_parameter(weight, 0, group, "padded vocabulary size")
        self.vocab_start = dist.get_rank(group) * self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local_ids = ids - self.vocab_start
        elsewhere = (local_ids < 0) | (local_ids >= self.weight.shape[0])
        embedded = F.embedding(local_ids.masked_fill(elsewhere, 0), self.weight)
        return reduce_from_tensor_parallel_region(embedded.masked_fill(elsewhere.unsqueeze(-1), 0.0), self.group)

    def extra_repr(self) -> str:
        last_row = self.vocab_start + self.weight.shape[0] - 1
        return f"vocab_rows={self.vocab_start}..{last_row}, dim={self.weight.shape[1]}"


class RNGForkedDropout(nn.Dropout):
    """Dropout drawing from a tracker stream, for tensors that differ across TP ranks (e.g. sequence chunks)."""

    def __init__(self, p: float, rng_tracker: RNGStatesTracker):
        super().__init__(p)
        self.rng_tracker = rng_tracker

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with self.rng_tracker.fork(MODEL_PARALLEL_RNG):
            return super().forward(hidden)
