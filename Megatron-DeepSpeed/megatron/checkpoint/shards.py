"""Joining tensor-parallel shards into full tensors and cutting full tensors into shards, for the checkpoint
tools. Which dimension a parameter is split along is the tensor-parallel plan's rule
(model/parallelize.py's tensor_parallel_partition_dim), the same one the training layers follow; fused QKV
rows are ordered per attention head, so a dim-0 split hands each rank whole heads and joining is a plain
concatenation.
"""
from typing import Dict, List

import torch

from megatron.errors import require_divisible
from megatron.model.parallelize import tensor_parallel_partition_dim as split_dim
from megatron.tensor_parallel import shard_of as shard_along

__all__ = ["split_dim", "join_shards", "shard_of", "shard_state_dict", "overlapping_ranks", "shard_from_shards"]


def join_shards(name: str, shards: List[torch.Tensor], experts: bool = False) -> torch.Tensor:
    """The full tensor of GPTModel parameter `name` from its per-rank shards (ordered by tensor-parallel rank).
    `experts`: the MoE experts are split too (--enable-expert-tensor-parallelism)."""
    dim = split_dim(name, experts)
    if dim is None or len(shards) == 1:
        return shards[0]
    return torch.cat(shards, dim=dim)


def shard_of(name: str, full: torch.Tensor, rank: int, size: int, experts: bool = False) -> torch.Tensor:
    """Tensor-parallel rank `rank`'s shard of the full tensor `name`, out of `size` ranks (`experts`: as
    join_shards)."""
    dim = split_dim(name, experts)
    if dim is None or size == 1:
        return full
    return shard_along(full, dim, rank, size, what=f"{name}: dimension {dim} of size")


def shard_state_dict(full: Dict[str, torch.Tensor], rank: int, size: int) -> Dict[str, torch.Tensor]:
    return {name: shard_of(name, tensor, rank, size) for name, tensor in full.items()}


def overlapping_ranks(source_size: int, rank: int, size: int) -> List[int]:
    """The source tensor-parallel ranks (of `source_size`) whose shards overlap target rank `rank`'s (of
    `size`): each source rank holds the same fraction of every split tensor, so this holds for all of them."""
    return [source for source in range(source_size)
            if source * size < (rank + 1) * source_size and rank * source_size < (source + 1) * size]


def shard_from_shards(name: str, shards: Dict[int, torch.Tensor], source_size: int, rank: int,
                      size: int) -> torch.Tensor:
    """Target rank `rank`'s shard (of `size`) of tensor `name`, from the source shards it overlaps (`shards`, by
    source rank, of `source_size`; see overlapping_ranks): only the overlapping ranges are read, and no full
    tensor is made. A tensor that is not split comes whole from any source shard."""
    dim = split_dim(name)
    first = shards[min(shards)]
    if dim is None:
        return first
    step = first.shape[dim]
    full = step * source_size
    require_divisible(f"{name}: dimension {dim} of size", full, "--tensor-model-parallel-size", size,
                      "choose a tensor-parallel size that divides it")
    start, stop = rank * full // size, (rank + 1) * full // size
    parts = []
    for source in sorted(shards):
        low, high = max(start, source * step), min(stop, (source + 1) * step)
        if low < high:
            parts.append(shards[source].narrow(dim, low - source * step, high - low))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
