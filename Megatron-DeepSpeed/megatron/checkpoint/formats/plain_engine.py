"""DeepSpeed's plain engine: the whole module in each tensor-parallel rank's mp_rank_XX_model_states.pt (nested as
upstream's GPTModel nests it, or flat as earlier versions wrote it), and an MoE model's experts in DeepSpeed's
expert files, layer_{i}_expert_{e}_mp_rank_{mp:02d}_model_states.pt (detect.PLAIN)."""
import os
from typing import Dict, Hashable, Mapping

import torch

from megatron.checkpoint.file_names import EXPERT_FILE_PATTERN, model_states_file
from megatron.checkpoint.formats.detect import Layout
from megatron.checkpoint.formats.weight_units import (TensorShard, Units, all_mappable, assembled, joined, names_in,
                                                      piece_unit)
from megatron.checkpoint.parameter_names import expert_model_name, flatten, is_nested, nest
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.shards import split_dim
from megatron.checkpoint.tensor_records import FileSections


def module_names(module: Mapping[str, object]) -> Dict[str, torch.Tensor]:
    """A plain engine's `module` under GPTModel's names: nested as upstream's, or flat as earlier versions."""
    return flatten(module) if is_nested(module) else flatten(nest(module))


def _plain_engine_units(tag_dir: str, layout: Layout, num_layers: int, part: TensorShard,
                        split_experts: bool = False) -> Units:
    """`split_experts` (--enable-expert-tensor-parallelism at TP > 1): PR-MoE's dense MLP, split like the experts
    but kept in these files, is joined whole from every rank's file, since the model read holds it whole."""
    sources = part.sources(layout.tensor)
    ranks = range(layout.tensor) if split_experts else sources
    paths = {tp: os.path.join(tag_dir, model_states_file(tp, layout.zero_stage)) for tp in ranks}
    mappable = all_mappable(paths.values())
    modules = FileSections(paths, lambda contents: module_names(contents["module"]))
    module = modules.names(min(paths))
    of = {name: piece_unit(mappable, 0, name, num_layers) for name in module}
    with_experts = {name for name in module if split_experts and split_dim(name, True) != split_dim(name)}

    def read(unit: Hashable) -> dict:
        names = names_in(of, unit)
        shards = {tp: modules.take(tp, names) for tp in paths if tp in sources or with_experts.intersection(names)}
        return {name: part.joined_experts(name, [shards[tp][name] for tp in ranks]) if name in with_experts
                else assembled(part, {tp: shards[tp] for tp in sources}, layout.tensor, name, name)
                for name in names}
    return Units(of, read)


def _expert_units(tag_dir: str, split: bool, part: TensorShard) -> Units:
    """Every expert of an MoE checkpoint, under the single-process model's names, from the expert files of all
    model-parallel ranks, one expert at a time. Whole experts: one file each (a tensor-parallel rank holds the same
    experts as another, then with the same values, or other experts; the lowest rank's file is read). `split`
    (--enable-expert-tensor-parallelism at TP > 1): each rank's file holds its shards of the expert, joined by the
    tensor-parallel plan's rule; the unit is then that expert's files of every rank. Each file is parsed once
    (tensor_records), so a unit read again (a writer asking for an expert's shape) only maps its files."""
    found = {name: os.path.join(tag_dir, name) for name in sorted(os.listdir(tag_dir))
             if EXPERT_FILE_PATTERN.fullmatch(name)}
    sections = FileSections({path: path for path in found.values()}, lambda contents: contents)
    files: Dict[str, Dict[int, str]] = {}  # name -> model-parallel rank -> its file
    keys: Dict[str, str] = {}  # name -> its key in the files (upstream's longer module path, or ours)
    for file_name, path in found.items():
        for key in sections.names(path):
            keys[expert_model_name(key)] = key
            files.setdefault(expert_model_name(key), {})[int(EXPERT_FILE_PATTERN.fullmatch(file_name).group(3))] = path
    of = {name: tuple(by_rank[rank] for rank in sorted(by_rank)) if split else by_rank[min(by_rank)]
          for name, by_rank in files.items()}

    def read(unit: Hashable) -> dict:
        paths, names = unit if split else (unit,), names_in(of, unit)
        states = [sections.take(path, [keys[name] for name in names]) for path in paths]
        return {name: part.joined_experts(name, [state[keys[name]] for state in states]) if split
                else part.in_halves(name, states[0][keys[name]]) for name in names}
    return Units(of, read)


def units(tag_dir: str, layout: Layout, flags: RecordedFlags, _kind: str, part: TensorShard) -> Units:
    """The module's weights joined with the expert files' (at TP > 1 split as the flags recorded)."""
    split = flags.experts_split and layout.tensor > 1
    return joined(_plain_engine_units(tag_dir, layout, flags.num_layers, part, split), _expert_units(tag_dir, split, part))
