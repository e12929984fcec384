"""Joining tensor-parallel shards into full tensors and cutting full tensors into shards, for the checkpoint
tools. How a parameter is split is the tensor-parallel plan's rule (model/parallelize.py's
tensor_parallel_partition_dim), the same one the training layers follow: along one dim, fused QKV rows ordered per
query group, so a dim-0 split hands each rank whole groups; a SwiGLU MLP's dense_h_to_4h ([gate; up]) split half by
half, so rank r holds [gate_r; up_r] (`swiglu`: the model has SwiGLU MLPs, --swiglu).
"""
from typing import Dict, List, Optional

import torch

from megatron.errors import require_divisible
from megatron.model.parallelize import tensor_parallel_partition_dim as split_dim
from megatron.tensor_parallel import shard_of as shard_along
from megatron.tensor_parallel.plan import joined

__all__ = ["split_dim", "join_shards", "shard_of", "shard_state_dict", "overlapping_ranks", "shard_from_shards",
           "HALVES", "INTERLEAVED", "in_halves"]

# How a --swiglu checkpoint holds dense_h_to_4h's rows (detect.gate_up_rows): each tensor-parallel rank's [gate_r;
# up_r] halves (upstream Megatron-DeepSpeed main's, Megatron's, and this project's now), or [ffn, (gate, up)]
# interleaved unit by unit (this project's before it took upstream's order: a plain dim-0 split).
HALVES, INTERLEAVED = "halves", "interleaved"


def in_halves(name: str, tensor: torch.Tensor, gate_up: Optional[str]) -> torch.Tensor:
    """Parameter `name` (or its Adam state) as read from a checkpoint whose rows are `gate_up`, in the model's
    [gate; up] halves: interleaved rows of a dense_h_to_4h (a whole tensor, or a contiguous range of units, as a
    plain split cuts them) put gate units first, once, at load."""
    if gate_up != INTERLEAVED or name.split(".")[-2] != "dense_h_to_4h":
        return tensor
    return tensor.unflatten(0, (-1, 2)).transpose(0, 1).flatten(0, 1)


def join_shards(name: str, shards: List[torch.Tensor], experts: bool = False, swiglu: bool = False) -> torch.Tensor:
    """The full tensor of GPTModel parameter `name` from its per-rank shards (ordered by tensor-parallel rank).
    `experts`: the MoE experts are split too (--enable-expert-tensor-parallelism)."""
    split = split_dim(name, experts, swiglu)
    if split is None or len(shards) == 1:
        return shards[0]
    return joined(shards, split)


def shard_of(name: str, full: torch.Tensor, rank: int, size: int, experts: bool = False,
             swiglu: bool = False) -> torch.Tensor:
    """Tensor-parallel rank `rank`'s shard of the full tensor `name`, out of `size` ranks (`experts`: as
    join_shards)."""
    split = split_dim(name, experts, swiglu)
    if split is None or size == 1:
        return full
    return shard_along(full, split.dim, rank, size, f"{name}: dimension {split.dim} of size", split.blocks)


def shard_state_dict(full: Dict[str, torch.Tensor], rank: int, size: int,
                     swiglu: bool = False) -> Dict[str, torch.Tensor]:
    return {name: shard_of(name, tensor, rank, size, swiglu=swiglu) for name, tensor in full.items()}


def overlapping_ranks(source_size: int, rank: int, size: int) -> List[int]:
    """The source tensor-parallel ranks (of `source_size`) whose shards overlap target rank `rank`'s (of
    `size`): each source rank holds the same fraction of every split tensor (of each of its blocks), so this
    holds for all of them."""
    return [source for source in range(source_size)
            if source * size < (rank + 1) * source_size and rank * source_size < (source + 1) * size]


def shard_from_shards(name: str, shards: Dict[int, torch.Tensor], source_size: int, rank: int,
                      size: int, swiglu: bool = False) -> torch.Tensor:
    """Target rank `rank`'s shard (of `size`) of tensor `name`, from the source shards it overlaps (`shards`, by
    source rank, of `source_size`; see overlapping_ranks): only the overlapping ranges are read (of each block),
    and no full tensor is made. A tensor that is not split comes whole from any source shard."""
    split = split_dim(name, swiglu=swiglu)
    first = shards[min(shards)]
    if split is None:
        return first
    dim = split.dim + 1  # within each block
    blocked = {source: shard.unflatten(split.dim, (split.blocks, -1)) for source, shard in shards.items()}
    step = blocked[min(blocked)].shape[dim]
    full = step * source_size
    require_divisible(f"{name}: dimension {split.dim} of size", full, "--tensor-model-parallel-size", size,
                      "choose a tensor-parallel size that divides it")
    start, stop = rank * full // size, (rank + 1) * full // size
    parts = []
    for source in sorted(blocked):
        low, high = max(start, source * step), min(stop, (source + 1) * step)
        if low < high:
            parts.append(blocked[source].narrow(dim, low - source * step, high - low))
    part = parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
    return part.flatten(split.dim, split.dim + 1)
