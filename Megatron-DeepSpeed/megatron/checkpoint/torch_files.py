"""The one torch.load and the one torch.save of checkpoint files.

load_file reads any checkpoint file as data only (trust.py), memory-mapped where it can. torch.save writes each
tensor's whole storage, once per file however many tensors share it, so a tensor that is a view of a larger or
shared storage must be written from a copy of its own; a tensor that already owns its storage (a joined shard, a
whole tensor read from its own record) is written as it is, and the file's bytes are the same as from a copy,
without the copy's time."""
import os
from typing import Dict, Mapping, Tuple

import torch

from megatron.checkpoint import manifest, trust
from megatron.errors import InputError
from megatron.files.atomic import write_atomically


def save(path: str, contents: object) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(contents, path)


def replace(path: str, contents: object) -> None:
    """Write `contents` over the existing file `path` through a temporary file, so a failure leaves the old one."""
    write_atomically(path, lambda handle: torch.save(contents, handle))


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


def load_file(path: str, mmap: bool = True, meta: bool = False) -> dict:
    """The one torch.load of a checkpoint file: on the CPU, as data only (checkpoint/trust.py), memory-mapped
    unless `mmap` is False (tensors are read when used, so assembling a model holds about one copy of it), with
    an InputError naming the file when it is missing, truncated, not a torch file, or holds a type a checkpoint
    may not hold. A file in torch's legacy (non-zip) format cannot be memory-mapped: it is read whole. With
    `meta` (zip format only) its tensors are on the meta device, each storage marked with its offset in the file
    (tensor_records.py reads them from there)."""
    if not os.path.isfile(path):
        raise InputError(f"{path} is missing: the checkpoint in {os.path.dirname(path)} is incomplete; point at "
                         "a complete checkpoint (its 'latest' file names the newest complete one)")
    manifest.require_readable(path)
    try:
        return trust.torch_load(path, mmap=mmap and manifest.is_zip_archive(path), meta=meta)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError ... for a damaged file
        if trust.is_refusal(err):
            raise trust.refusal(path, trust.refused_type(err)) from None
        raise InputError(f"{path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                         "the file is truncated or damaged: copy it again or use another checkpoint") from err
