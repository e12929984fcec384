"""What every family's Hugging Face adapter builds on: tensors produced by name only when asked, our names taken
from theirs, the padded vocabulary, the dtype keys, and the key under which config.json carries the model flags
its architecture has no key for (transformers keeps it as an attribute and otherwise ignores it). Files are not
read or written here (hf/files.py does that)."""
from collections import abc
from typing import Callable, Iterable, Iterator, Mapping, Optional, Tuple

import torch

from megatron.errors import InputError

MODEL_FLAGS_KEY = "megatron_model_flags"  # our key: the model flags the architecture's config has none for
DTYPE_KEYS = ("dtype", "torch_dtype")  # transformers 5.x writes the first, 4.x the second


def unmapped_flags(config: Mapping[str, object], source: str) -> dict:
    """The model flags recorded under MODEL_FLAGS_KEY (none when absent)."""
    ours = config.get(MODEL_FLAGS_KEY) or {}
    if not isinstance(ours, dict):
        raise InputError(f"{source} sets {MODEL_FLAGS_KEY} to {ours!r}; it must map flag names to values "
                         "(or be removed)")
    return ours


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_keys(name: str) -> dict:
    """The weights' dtype under both transformers generations' keys."""
    return {key: name for key in DTYPE_KEYS}


class LazyTensors(abc.Mapping):
    """A mapping over a fixed set of tensor names whose tensors are produced only when asked (the subclass's
    __getitem__); membership, order and length come from the names, without producing anything."""

    def __init__(self, names: Iterable[str]):
        self._names = dict.fromkeys(names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class DerivedWeights(LazyTensors):
    """Our tensors by name, each computed from the Hugging Face tensors when asked (the last one kept, as a
    checkpoint writer asks for the same tensor once per tensor-parallel rank)."""

    def __init__(self, recipes: Mapping[str, Callable[[], torch.Tensor]]):
        super().__init__(recipes)
        self._recipes = dict(recipes)
        self._last: Tuple[Optional[str], Optional[torch.Tensor]] = (None, None)

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._last[0] != name:
            self._last = (None, None)
            self._last = (name, self._recipes[name]().contiguous())
        return self._last[1]


def taker(weights: Mapping[str, torch.Tensor], architecture: str, prefixes: Tuple[str, ...] = ("",)):
    """take(name): the tensor stored as name under the first of `prefixes` that has it, or an InputError."""

    def take(name: str) -> torch.Tensor:
        for prefix in prefixes:
            if prefix + name in weights:
                return weights[prefix + name]
        spelled = " / ".join(f"'{prefix}{name}'" for prefix in prefixes)
        raise InputError(f"the Hugging Face weights have no tensor {spelled}; they do not belong to a "
                         f"{architecture} of this config.json")
    return take


def padded_vocabulary(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """A vocabulary matrix zero-padded to `rows` rows (our padded vocabulary)."""
    if tensor.shape[0] > rows:
        raise InputError(f"the Hugging Face vocabulary has {tensor.shape[0]} rows, more than the padded size {rows}")
    padded = torch.zeros(rows, *tensor.shape[1:], dtype=tensor.dtype)
    padded[:tensor.shape[0]] = tensor
    return padded
