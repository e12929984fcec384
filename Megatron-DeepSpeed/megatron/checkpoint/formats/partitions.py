"""Flat partitions as DeepSpeed's ZeRO optimizers save them: a range of a group's flat buffer, read only where it
lies, and torch's optimizer state as file sections."""
from typing import Dict, Mapping, Sequence

import torch


def flat_range(groups: Sequence[torch.Tensor], offset: int, length: int) -> torch.Tensor:
    """Values offset..offset+length of the concatenation of `groups` (flattened), reading only those."""
    parts, start = [], 0
    for group in groups:
        flat = group.flatten()
        low, high = max(offset, start), min(offset + length, start + flat.numel())
        if low < high:
            parts.append(flat.narrow(0, low - start, high - low))
        start += flat.numel()
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def adam_tensors(state: Mapping) -> Dict[tuple, torch.Tensor]:
    """torch's optimizer `state` (by parameter or group index) as {(index, kind): tensor}, kind one of exp_avg,
    exp_avg_sq, step: a tensor_records section (a step kept as a number is left out)."""
    return {(index, kind): tensor for index, entry in state.items() for kind, tensor in entry.items()
            if isinstance(tensor, torch.Tensor)}
