"""Read a checkpoint of any layout a user brings (checkpoint/directory.py lists them) into the single-process
GPTModel's weights, in one CPU process (no torch.distributed): one unit builder per source layout (pipeline engine,
plain engine and its MoE expert files, Megatron, DeepSpeed universal, ZeRO 3), and read_checkpoint, which picks
the builder the files call for. Tensor-parallel shards are joined (shards.shard_from_shards) into full tensors, or
cut straight into one target rank's shards (weight_units.TensorShard) reading only the files and ranges it
overlaps; the result is keyed by the single-process GPTModel's parameter names, the tied word embedding once.
"""
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import torch

from megatron.checkpoint.client_state import is_current, recorded_consumed_samples
from megatron.checkpoint.directory import (Layout, checkpoint_directory, experts_split, holds_optimizer_state, layout_of, load_file,
                                           megatron_rank_file, read_client_state, training_dtype, whole_model_moe)
from megatron.checkpoint.layout import (ARGS, EXPERT_FILE_PATTERN, ITERATION, MEGATRON_MODEL, UNIVERSAL_DIR, layer_file,
                                        model_states_file, optimizer_states_file)
from megatron.checkpoint.names import (LAYERS_PREFIX, VOCABULARY_ROWS, current_name, expert_model_name, flatten,
                                       is_nested, model_name, name_at_position, nest, old_position_name,
                                       positions_with_parameters)
from megatron.checkpoint.shards import join_shards, split_dim
from megatron.checkpoint.tensor_records import FileSections
from megatron.checkpoint.weight_units import (WHOLE, Progress, StreamedWeights, TensorShard, Units, all_mappable,
                                              assembled, joined, names_in, piece_unit, quiet, read_whole)
from megatron.config.job import MoEConfig
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError
from megatron.model.pipe import output_layer_spec


@dataclass(frozen=True)
class Checkpoint:
    directory: str  # the global_step{N} directory read
    iteration: int
    consumed_train_samples: int
    args: Mapping[str, object]  # the flags of the run that wrote it (plain values)
    layout: Layout
    padded_vocab_size: int
    model: Mapping[str, torch.Tensor]  # full tensors (or a TensorShard's) under GPTModel's names, training dtype
    has_optimizer_state: bool  # False: saved with --no-save-optim, or converted with --weights-only
    old: bool = False  # written by an earlier version of this project (pipeline pieces numbered from 0)

    @property
    def model_config(self) -> ModelConfig:
        """The model the recorded flags describe (dropout and activation checkpointing as trained)."""
        return ModelConfig.from_flags(self.args, f"the flags recorded in {self.directory}")

    @property
    def moe(self) -> Optional[MoEConfig]:
        """Its mixture of experts as a single process holds them all (None: dense)."""
        return whole_model_moe(self.args)


# --- DeepSpeed's pipeline engine: one file per piece and tensor-parallel rank

def _pipeline_positions(tag_dir: str, num_layers: int) -> Tuple[bool, Sequence[int]]:
    """Whether the layer files are numbered as earlier versions of this project numbered them (embedding
    layer_00), and the spec positions that have a file."""
    old = os.path.isfile(os.path.join(tag_dir, layer_file(0, 0)))
    untied = os.path.isfile(os.path.join(tag_dir, layer_file(output_layer_spec(num_layers), 0)))
    return old, range(num_layers + 2) if old else positions_with_parameters(num_layers, untied)


def _piece_weights(tag_dir: str, layout: Layout, num_layers: int, old: bool, position: int,
                   part: TensorShard) -> dict:
    """`part` of each tensor of the piece at spec `position`, under GPTModel's names."""
    shards = {tp: load_file(os.path.join(tag_dir, layer_file(position, tp))) for tp in part.sources(layout.tensor)}
    names = {key: _piece_name(old, position, key, num_layers) for key in shards[min(shards)]}
    return {name: assembled(part, shards, layout.tensor, key, name) for key, name in names.items()}


def _piece_name(old: bool, position: int, key: str, num_layers: int) -> str:
    return (old_position_name if old else name_at_position)(position, key, num_layers)


def _pipeline_engine_units(tag_dir: str, layout: Layout, num_layers: int, part: TensorShard) -> Units:
    """The layer files: numbered as upstream's (model/pipe.py), or as earlier versions of this project numbered
    them (embedding layer_00); a piece's keys are read from the pickle, not its tensors."""
    old, positions = _pipeline_positions(tag_dir, num_layers)
    source = part.sources(layout.tensor)[0]
    of = {_piece_name(old, position, key, num_layers): position for position in positions
          for key in load_file(os.path.join(tag_dir, layer_file(position, source)))}
    return Units(of, lambda position: _piece_weights(tag_dir, layout, num_layers, old, position, part))


# --- DeepSpeed's plain engine: the whole module in each tensor-parallel rank's model-states file

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
        return {name: join_shards(name, [shards[tp][name] for tp in ranks], experts=True) if name in with_experts
                else assembled(part, {tp: shards[tp] for tp in sources}, layout.tensor, name, name)
                for name in names}
    return Units(of, read)


def _expert_units(tag_dir: str, split: bool) -> Units:
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
        return {name: join_shards(name, [state[keys[name]] for state in states], experts=True) if split
                else states[0][keys[name]] for name in names}
    return Units(of, read)


# --- Megatron's layout: one file per tensor- and pipeline-parallel rank

def _megatron_units(tag_dir: str, layout: Layout, num_layers: int, part: TensorShard) -> Units:
    """Each stage's layers numbered from 0 in its file; the stages' layers follow one another."""
    sources = part.sources(layout.tensor)
    paths = {(tp, pp): megatron_rank_file(tag_dir, tp, pp, layout.pipeline)
             for pp in range(layout.pipeline) for tp in sources}
    mappable = all_mappable(paths.values())
    stages = FileSections(paths, lambda contents: flatten(contents[MEGATRON_MODEL]))
    keys, of, first_layer = {}, {}, 0  # GPTModel name -> its key in its stage's files, its unit
    for pp in range(layout.pipeline):
        stage_layers = set()
        for key in stages.names((sources[0], pp)):
            name = key
            if key.startswith(LAYERS_PREFIX):
                _, number, rest = key.split(".", 2)
                stage_layers.add(int(number))
                name = f"{LAYERS_PREFIX}{first_layer + int(number)}.{rest}"
            keys[name], of[name] = key, piece_unit(mappable, pp, name, num_layers)
        first_layer += len(stage_layers)

    def read(unit: Hashable) -> dict:
        names, pp = names_in(of, unit), unit[0]
        shards = {tp: stages.take((tp, pp), [keys[name] for name in names]) for tp in sources}
        return {name: assembled(part, shards, layout.tensor, keys[name], name) for name in names}
    return Units(of, read)


# --- DeepSpeed universal (ds_to_universal's output): one file per full parameter

def _universal_units(tag_dir: str, num_layers: int, padded_vocab_size: int, part: TensorShard) -> Units:
    """zero/<engine name>/fp32.pt of a universal checkpoint, the vocabulary padding ds_to_universal strips put
    back (as zeros, as DeepSpeed's loader pads it)."""
    universal = os.path.join(tag_dir, UNIVERSAL_DIR)
    entries = sorted(entry for entry in os.listdir(universal) if os.path.isdir(os.path.join(universal, entry)))
    of = {model_name(entry, num_layers): entry for entry in entries}

    def read(entry: str) -> dict:
        name, tensor = model_name(entry, num_layers), load_file(os.path.join(universal, entry, "fp32.pt"))["param"]
        whole = padded_rows(tensor, padded_vocab_size) if name in VOCABULARY_ROWS else tensor
        return {name: part.assemble(name, {0: whole}, 1)}
    return Units(of, read)


def padded_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` with zero rows appended up to `rows` (a vocabulary whose padding ds_to_universal stripped)."""
    if tensor.dim() == 0 or tensor.shape[0] >= rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


# --- ZeRO 3: the weights are the fp32 partitions in the optimizer files

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


def adam_tensors(state: Mapping) -> Dict[tuple, torch.Tensor]:
    """torch's optimizer `state` (by parameter or group index) as {(index, kind): tensor}, kind one of exp_avg,
    exp_avg_sq, step: a tensor_records section (a step kept as a number is left out)."""
    return {(index, kind): tensor for index, entry in state.items() for kind, tensor in entry.items()
            if isinstance(tensor, torch.Tensor)}


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


def zero3_files(tag_dir: str, layout: Layout, args: Mapping[str, object], sources: Sequence[int]) -> Zero3Files:
    """The files of the tensor-parallel ranks `sources` (DeepSpeed names them bf16_... under --bf16)."""
    sections = FileSections({(tp, dp): os.path.join(tag_dir, optimizer_states_file(tp, dp, bool(args.get("bf16"))))
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


def zero3_units(tag_dir: str, layout: Layout, args: Mapping[str, object], num_layers: int, part: TensorShard,
                kind: str = "fp32", dtype: Optional[torch.dtype] = None, files: Optional[Zero3Files] = None) -> Units:
    """ZeRO 3's fp32 weights (`kind` fp32, cast to `dtype` unless None) or an Adam moment (exp_avg, exp_avg_sq),
    kept in the same flat layout: a parameter is read from each data-parallel rank's optimizer file, its range of
    the memory-mapped partitions only. `files`: zero3_files' (shared by the kinds), or None to parse them here."""
    sources = part.sources(layout.tensor)
    files = files or zero3_files(tag_dir, layout, args, sources)
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


def read_checkpoint(load_dir: str, iteration: Optional[int] = None, progress: Progress = quiet,
                    universal: bool = False, part: TensorShard = WHOLE, streamed: bool = False,
                    optimizer: bool = True) -> Checkpoint:
    """The checkpoint in `load_dir` (its newest, or that of `iteration`; with `universal` the one
    `latest_universal` names) with the full model weights, or with `part`'s shard of each (its padded
    vocabulary size is still the whole model's). With `streamed`, the weights are read when asked for
    (StreamedWeights), for a caller that uses one tensor at a time. Without `optimizer` (a reader of the weights
    alone) the optimizer-state files may be missing."""
    tag_dir = checkpoint_directory(load_dir, iteration, universal)
    state = read_client_state(tag_dir, whole=part == WHOLE, optimizer=optimizer)  # not kept: the weights are read again, unit by unit
    args = state[ARGS]
    layout = layout_of(state, tag_dir)
    num_layers = int(args["num_layers"])
    engine_weights = (any(name.startswith("layer_") for name in os.listdir(tag_dir)) if layout.pipeline_engine
                      else state.get("module") is not None or not layout.universal)
    if layout.megatron:
        units = _megatron_units(tag_dir, layout, num_layers, part)
    elif not engine_weights:  # DeepSpeed's ds_to_universal copies the model-states files only
        units = _universal_units(tag_dir, num_layers, int(args["padded_vocab_size"]), part)
    elif layout.pipeline_engine:
        units = _pipeline_engine_units(tag_dir, layout, num_layers, part)
    elif layout.zero_stage == 3:
        units = zero3_units(tag_dir, layout, args, num_layers, part, dtype=training_dtype(args))
    else:
        split = experts_split(args) and layout.tensor > 1
        units = joined(_plain_engine_units(tag_dir, layout, num_layers, part, split), _expert_units(tag_dir, split))
    model = StreamedWeights(units) if streamed else read_whole(units, progress)
    padded_vocab_size = model["embedding.word_embeddings.weight"].shape[0] * part.size  # rows are split
    return Checkpoint(directory=tag_dir, iteration=int(state[ITERATION]),
                      consumed_train_samples=recorded_consumed_samples(state), args=MappingProxyType(dict(args)),
                      layout=layout, padded_vocab_size=padded_vocab_size, model=MappingProxyType(model),
                      has_optimizer_state=holds_optimizer_state(tag_dir, state), old=not is_current(state))
