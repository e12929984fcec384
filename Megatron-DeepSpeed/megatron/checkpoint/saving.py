"""torch.save of the files the checkpoint tools write. torch.save writes each tensor's whole storage, once per
file however many tensors share it, so a tensor that is a view of a larger or shared storage must be written
from a copy of its own; a tensor that already owns its storage (a joined shard, a whole tensor read from its own
record) is written as it is, and the file's bytes are the same as from a copy, without the copy's time."""
import os
from typing import Dict, Mapping, Tuple

import torch


def save(path: str, contents: object) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(contents, path)


def _contiguous_strides(shape: torch.Size) -> Tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def own_storages(tensors: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """`tensors` as torch.save would write clones of them: each one that does not fill a storage of its own
    (in row-major order, as a clone would) is cloned, the others are kept."""
    seen, result = set(), {}
    for key, tensor in tensors.items():
        storage = tensor.untyped_storage()
        owned = (tensor.storage_offset() == 0 and tensor.stride() == _contiguous_strides(tensor.shape)
                 and storage.nbytes() == tensor.numel() * tensor.element_size() and storage.data_ptr() not in seen)
        result[key] = tensor if owned else tensor.clone()
        seen.add(result[key].untyped_storage().data_ptr())
    return result
