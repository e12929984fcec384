"""Joining tensor-parallel shards into full tensors and cutting full tensors into shards, for the checkpoint
tools. Which dimension a parameter is split along is the tensor-parallel plan's rule
(model/parallelize.py's tensor_parallel_partition_dim), the same one the training layers follow; fused QKV
rows are ordered per attention head, so a dim-0 split hands each rank whole heads and joining is a plain
concatenation.
"""
from typing import Dict, List

import torch

from megatron.model.parallelize import tensor_parallel_partition_dim as split_dim
from megatron.tensor_parallel import shard_of as shard_along

__all__ = ["split_dim", "join_shards", "shard_of", "shard_state_dict"]


def join_shards(name: str, shards: List[torch.Tensor]) -> torch.Tensor:
    """The full tensor of GPTModel parameter `name` from its per-rank shards (ordered by tensor-parallel rank)."""
    dim = split_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    return torch.cat(shards, dim=dim)


def shard_of(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Tensor-parallel rank `rank`'s shard of the full tensor `name`, out of `size` ranks."""
    dim = split_dim(name)
    if dim is None or size == 1:
        return full
    return shard_along(full, dim, rank, size, what=f"{name}: dimension {dim} of size")


def shard_state_dict(full: Dict[str, torch.Tensor], rank: int, size: int) -> Dict[str, torch.Tensor]:
    return {name: shard_of(name, tensor, rank, size) for name, tensor in full.items()}
