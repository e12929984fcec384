"""ZeRO stage 3: the weights are the flat fp32 partitions in every data-parallel rank's optimizer file
(zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt), Adam's moments kept in the same flat layout, every parameter
split on its own (zero3_placement); the model-states files hold the client state and param_shapes (detect.ZERO3)."""
import os
from dataclasses import dataclass, replace
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import torch

from megatron.checkpoint.file_names import MOMENTS, model_states_file, optimizer_states_file
from megatron.checkpoint.formats.checkpoint import Checkpoint, OptimizerState, without_params
from megatron.checkpoint.formats.detect import Layout
from megatron.checkpoint.formats.partitions import adam_tensors, flat_range
from megatron.checkpoint.formats.weight_units import (WHOLE, Progress, StreamedWeights, TensorShard, Units,
                                                      all_mappable, assembled, names_in, piece_unit)
from megatron.checkpoint.parameter_names import current_name
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.tensor_records import FileSections
from megatron.checkpoint.torch_files import load_file
from megatron.errors import InputError


Zero3Place = Tuple[int, int, torch.Size]  # offset in a rank's flat partition, elements per rank, shape


def zero3_placement(param_shapes: List[Mapping[str, torch.Size]], world: int) -> Tuple[Dict[str, Zero3Place], int]:
    """Where each parameter lies in ZeRO-3's flat partitions (one flat tensor per data-parallel rank, its groups
    concatenated), and how many values a rank holds: each parameter is split on its own into ceil(numel / DP)
    elements per rank, laid out one after another in the order of param_shapes."""
    placement, offset = {}, 0
    for name, shape in ((name, shape) for group in param_shapes for name, shape in group.items()):
        per_rank = -(-torch.Size(shape).numel() // world)
        placement[name] = (offset, per_rank, torch.Size(shape))
        offset += per_rank
    return placement, offset


def _check_zero3_size(flat_size: int, accounted: int) -> None:
    if accounted != flat_size:
        raise InputError(f"ZeRO-3 partitions hold {flat_size} values per rank but the parameter shapes account for "
                         f"{accounted}: the checkpoint's files do not belong together")


def zero3_parameter(place: Zero3Place, groups_per_rank: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    """One full parameter from every data-parallel rank's flat groups, copied once into a tensor of its own (the
    last ranks' padding left out)."""
    offset, per_rank, shape = place
    whole = torch.empty(shape.numel(), dtype=groups_per_rank[0][0].dtype)
    for rank, groups in enumerate(groups_per_rank):
        length = min(per_rank, shape.numel() - rank * per_rank)
        if length > 0:
            whole.narrow(0, rank * per_rank, length).copy_(flat_range(groups, offset, length))
    return whole.view(shape)


def _zero3_section(contents: Mapping) -> Dict[tuple, torch.Tensor]:
    """{(group, kind): flat tensor} of one ZeRO-3 partition: the fp32 weights and, when saved, Adam's state."""
    partition = contents["optimizer_state_dict"]
    tensors = {(group, "fp32"): flat for group, flat in enumerate(partition["fp32_flat_groups"])}
    return {**tensors, **adam_tensors(partition.get("optimizer_state_dict", {}).get("state", {}))}


@dataclass(frozen=True)
class Zero3Files:
    """The optimizer files of some tensor-parallel ranks (every data-parallel rank's), each parsed once for all
    the units and kinds read from them, and where each rank's parameters lie in them."""
    sections: FileSections  # by (tensor-parallel rank, data-parallel rank)
    placements: Dict[int, Dict[str, Zero3Place]]  # per tensor-parallel rank: engine name -> place
    accounted: Dict[int, int]  # per tensor-parallel rank: the values a data-parallel rank holds


def zero3_files(tag_dir: str, layout: Layout, flags: RecordedFlags, sources: Sequence[int]) -> Zero3Files:
    """The files of the tensor-parallel ranks `sources` (DeepSpeed names them bf16_... under --bf16)."""
    sections = FileSections({(tp, dp): os.path.join(tag_dir, optimizer_states_file(tp, dp, flags.bf16))
                             for tp in sources for dp in range(layout.data)}, _zero3_section)
    placements, accounted = {}, {}
    for tp in sources:
        shapes = load_file(os.path.join(tag_dir, model_states_file(tp, 3)))["param_shapes"]
        placements[tp], accounted[tp] = zero3_placement(shapes, layout.data)
    return Zero3Files(sections, placements, accounted)


def _zero3_groups(files: FileSections, key: tuple, kind: str) -> List[tuple]:
    """The names (group, kind) of one rank's flat partitions of `kind`, in the order of the parameter groups."""
    partition = files.contents(key)["optimizer_state_dict"]
    groups = range(len(partition["fp32_flat_groups"])) if kind == "fp32" else sorted(
        partition["optimizer_state_dict"]["state"])
    return [(group, kind) for group in groups]


def zero3_units(tag_dir: str, layout: Layout, flags: RecordedFlags, part: TensorShard,
                kind: str = "fp32", dtype: Optional[torch.dtype] = None, files: Optional[Zero3Files] = None) -> Units:
    """ZeRO 3's fp32 weights (`kind` fp32, cast to `dtype` unless None) or an Adam moment (exp_avg, exp_avg_sq),
    kept in the same flat layout: a parameter is read from each data-parallel rank's optimizer file, its range of
    the memory-mapped partitions only. `files`: zero3_files' (shared by the kinds), or None to parse them here."""
    sources = part.sources(layout.tensor)
    files = files or zero3_files(tag_dir, layout, flags, sources)
    num_layers = flags.num_layers
    placements, sections = files.placements, files.sections
    for tp in sources:
        metas = _zero3_section(sections.contents((tp, 0)))
        _check_zero3_size(sum(metas[group].numel() for group in _zero3_groups(sections, (tp, 0), kind)),
                          files.accounted[tp])
    engine_names = {current_name(name): name for name in placements[sources[0]]}  # GPTModel name -> engine name
    mappable = all_mappable(sections.paths())
    of = {name: piece_unit(mappable, 0, name, num_layers) for name in engine_names}

    def read(unit: Hashable) -> dict:
        names = names_in(of, unit)
        shards = {}
        for tp in sources:
            groups = []
            for dp in range(layout.data):
                wanted = _zero3_groups(sections, (tp, dp), kind)
                taken = sections.take((tp, dp), wanted)
                groups.append([taken[group] for group in wanted])
            shards[tp] = {}
            for name in names:
                tensor = zero3_parameter(placements[tp][engine_names[name]], groups)
                shards[tp][name] = tensor if dtype is None else tensor.to(dtype)
        return {name: assembled(part, shards, layout.tensor, name, name) for name in names}
    return Units(of, read)


def units(tag_dir: str, layout: Layout, flags: RecordedFlags, _kind: str, part: TensorShard) -> Units:
    return zero3_units(tag_dir, layout, flags, part, dtype=flags.dtype)


def optimizer_state(checkpoint: Checkpoint, progress: Progress) -> OptimizerState:
    """Each kind read one model piece at a time when asked for (reader.zero3_units), as the weights are; the
    optimizer files parsed once for all kinds."""
    progress("ZeRO-3 optimizer state: read as each parameter is written")
    layout, flags = checkpoint.layout, checkpoint.flags
    files = zero3_files(checkpoint.directory, layout, flags, range(layout.tensor))
    whole = replace(WHOLE, gate_up=checkpoint.gate_up)
    kinds = {kind: StreamedWeights(zero3_units(checkpoint.directory, layout, flags, whole, kind, files=files))
             for kind in ("fp32", *MOMENTS)}
    adam = files.sections.contents((0, 0))["optimizer_state_dict"]["optimizer_state_dict"]
    step = int(files.sections.scalar((0, 0), adam["state"][0]["step"]))
    return OptimizerState(step=step, param_groups=without_params(adam["param_groups"]), **kinds)
