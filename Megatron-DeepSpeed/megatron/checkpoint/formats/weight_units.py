"""Reading a checkpoint's weights in units, whatever its layout: each format's module (formats/reader.WEIGHT_UNITS)
lists the unit of each GPTModel name and reads one unit's tensors; here the whole model is read unit by unit, or streamed
(one unit held at a time), and a TensorShard cuts each tensor to one target tensor-parallel rank's shard, reading
only the source shards it overlaps."""
from collections import abc
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterator, List, Mapping, Optional, Tuple

import torch

from megatron.checkpoint import manifest
from megatron.checkpoint.parameter_names import spec_position
from megatron.checkpoint.shards import HALVES, in_halves, join_shards, overlapping_ranks, shard_from_shards

Progress = Callable[[str], None]


def quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class TensorShard:
    """Which part of each tensor read_checkpoint assembles: target tensor-parallel rank `rank` of `size` (the
    whole tensor: rank 0 of 1). Only the source files and ranges that part overlaps are read, so a rank of
    a generation or evaluation job holds its shard, never the whole model."""
    rank: int = 0
    size: int = 1
    gate_up: Optional[str] = None  # a --swiglu source's dense_h_to_4h rows (shards.HALVES or INTERLEAVED): set by
    # read_checkpoint from the checkpoint itself (detect.gate_up_rows)

    def sources(self, source_size: int) -> List[int]:
        return overlapping_ranks(source_size, self.rank, self.size)

    def assemble(self, name: str, shards: Dict[int, torch.Tensor], source_size: int) -> torch.Tensor:
        """A shard comes as its own copy, so each file's memory map can close after its piece and the pages
        read count once; whole tensors stay as read (views into the maps where nothing was joined). SwiGLU rows
        come as the model's [gate; up] halves whatever the source held (shards.in_halves)."""
        part = shard_from_shards(name, shards, source_size, self.rank, self.size, swiglu=self.gate_up == HALVES)
        part = self.in_halves(name, part)
        return part if self.size == 1 else part.clone()

    def in_halves(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return in_halves(name, tensor, self.gate_up)

    def joined_experts(self, name: str, shards: List[torch.Tensor]) -> torch.Tensor:
        """The whole tensor of an MoE expert's parameter (or PR-MoE's dense MLP's) split under
        --enable-expert-tensor-parallelism, from every rank's shard."""
        return self.in_halves(name, join_shards(name, shards, experts=True, swiglu=self.gate_up == HALVES))


WHOLE = TensorShard()


def assembled(part: TensorShard, shards: Dict[int, Mapping[str, torch.Tensor]], source_size: int, key: str,
               name: str) -> torch.Tensor:
    """`part` of tensor `name`, stored under `key` in the source shards (state dicts by source rank)."""
    return part.assemble(name, {tp: shard[key] for tp, shard in shards.items()}, source_size)


@dataclass(frozen=True)
class Units:
    """A layout's weights as units read one at a time: the unit of each GPTModel name (in the order the whole
    model lists them) and how to read one unit's tensors. A unit is a model piece (embedding, one layer, the
    final LayerNorm) of one set of memory-mapped files, an expert file, or, for a file in torch's legacy
    (non-zip) format, which cannot be memory-mapped, the whole file set (read whole, one set at a time)."""
    of: Dict[str, Hashable]
    read: Callable[[Hashable], Dict[str, torch.Tensor]]


def names_in(of: Mapping[str, Hashable], unit: Hashable) -> List[str]:
    return [name for name, its in of.items() if its == unit]


def piece_unit(mappable: bool, files: Hashable, name: str, num_layers: int) -> Hashable:
    """The unit of GPTModel parameter `name` in the file set `files`: its model piece, or the whole set."""
    return (files, spec_position(name, num_layers)[0]) if mappable else (files,)


def all_mappable(paths) -> bool:
    return all(manifest.is_zip_archive(path) for path in paths)


def joined(first: Units, second: Units) -> Units:
    """Both sets of units, the second's names added after (or over) the first's."""
    of = {name: (0, unit) for name, unit in first.of.items()}
    of.update((name, (1, unit)) for name, unit in second.of.items())
    return Units(of, lambda unit: (first, second)[unit[0]].read(unit[1]))


def read_whole(units: Units, progress: Progress) -> dict:
    """Every unit read once, in order: the whole model (or a TensorShard's part of it) in memory."""
    order = list(dict.fromkeys(units.of.values()))
    model = {}
    for index, unit in enumerate(order):
        progress(f"reading part {index + 1}/{len(order)} of the weights")
        model.update(units.read(unit))
    return {name: model[name] for name in units.of}


class StreamedWeights(abc.Mapping):
    """A checkpoint's weights read one unit (Units) at a time when asked for, only the last unit kept: a
    converter writing one target file at a time then holds that file and one source piece, never the whole
    model (the tensors are those read whole, so what is written stays the same)."""

    def __init__(self, units: Units):
        self._units = units
        self._unit: Tuple[Optional[Hashable], dict] = (None, {})

    def __getitem__(self, name: str) -> torch.Tensor:
        unit = self._units.of[name]
        if self._unit[0] != unit:
            self._unit = (None, {})  # drop the last unit before reading the next
            self._unit = (unit, self._units.read(unit))
        return self._unit[1][name]

    def __contains__(self, name: object) -> bool:  # without reading the unit, as Mapping's default would
        return name in self._units.of

    def __iter__(self) -> Iterator[str]:
        return iter(self._units.of)

    def __len__(self) -> int:
        return len(self._units.of)
