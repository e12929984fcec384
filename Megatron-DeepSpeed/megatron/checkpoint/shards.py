"""How each GPTModel parameter is split over tensor-parallel ranks (DESIGN §9), by name: the one table the
checkpoint tools use to join shards into full tensors and to cut full tensors into shards.

Column-parallel linears (fused QKV, h_to_4h) split their output rows (dim 0, weight and bias); row-parallel
linears (attention.dense, 4h_to_h) split their input columns (dim 1; the bias is replicated); the word
embedding splits its padded vocabulary rows (dim 0). Everything else is replicated. Fused QKV rows are
ordered per attention head, so a dim-0 split hands each rank whole heads and joining is a plain concatenation.
"""
import re
from typing import Dict, List, Optional

import torch

from megatron.errors import InputError

_SPLIT_DIMS = ((re.compile(r"(^|\.)word_embeddings\.weight$"), 0),
               (re.compile(r"(^|\.)(query_key_value|dense_h_to_4h)\.(weight|bias)$"), 0),
               (re.compile(r"(^|\.)(attention\.dense|dense_4h_to_h)\.weight$"), 1))


def split_dim(name: str) -> Optional[int]:
    """The dimension along which parameter `name` is split over tensor-parallel ranks; None if replicated."""
    for pattern, dim in _SPLIT_DIMS:
        if pattern.search(name):
            return dim
    return None


def join_shards(name: str, shards: List[torch.Tensor]) -> torch.Tensor:
    """The full tensor of `name` from its per-rank shards (ordered by tensor-parallel rank)."""
    dim = split_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    return torch.cat(shards, dim=dim)


def shard_of(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Tensor-parallel rank `rank`'s shard of the full tensor `name`, out of `size` ranks."""
    dim = split_dim(name)
    if dim is None or size == 1:
        return full
    if full.shape[dim] % size:
        raise InputError(f"{name}: dimension {dim} of size {full.shape[dim]} cannot be split evenly over tensor "
                         f"parallel size {size}; choose a tensor-parallel size that divides it")
    return full.chunk(size, dim=dim)[rank]


def shard_state_dict(full: Dict[str, torch.Tensor], rank: int, size: int) -> Dict[str, torch.Tensor]:
    return {name: shard_of(name, tensor, rank, size) for name, tensor in full.items()}
