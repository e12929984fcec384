"""The Adam state of a checkpoint, assembled per full parameter: fp32 master weights, first and second
moments and the step count, keyed by GPTModel's names, from whichever layout DeepSpeed wrote.

  ZeRO 0 (fp32)  torch's optimizer state_dict in each model-parallel rank's mp_rank file: state by parameter
                 index, counted over the parameter groups (decayed matrices, then vectors, see
                 megatron/training/optimizer.py) in the order of that rank's module parameters; the master weights
                 are the weights. In fp16/bf16 DeepSpeed's wrapper's form (mixed_precision_state.py): torch's
                 beside the master weights (FP16_UnfusedOptimizer), per group flat (FP16_Optimizer), or, on the
                 pipeline engine in bf16, BF16_Optimizer's data-parallel slices of each flat group, read as ZeRO 1's.
  ZeRO 1 / 2     per data-parallel rank, the rank's slice of each group's flat fp32 buffer
                 (single_partition_of_fp32_groups, group padding stripped) and of the Adam state (padded);
                 the group's parameters, in flat order, are `param_shapes` in the mp_rank file, each
                 followed by its alignment padding (param_alignment_paddings). DeepSpeed's MoE groups are
                 partitioned over the ranks that hold the same experts instead.
  MoE, ZeRO 0    per expert-parallel rank, torch's state_dict of its parameters; in fp16/bf16 wrapped by
                 DeepSpeed's FP16_UnfusedOptimizer with the master weights and the loss scale
                 (expert_optimizer_state.py).
  ZeRO 3         per data-parallel rank, fp32_flat_groups and the Adam state in the same flat layout, every
                 parameter split on its own (zero3.zero3_placement).
  universal      (written by convert/target_writer.py)
                 zero/<engine parameter name>/{fp32,exp_avg,exp_avg_sq,step}.pt, full tensors, and zero/optimizer_state.pt with the hyperparameters.
Every layout is read one model piece (one parameter file) at a time, memory-mapped, when the writer asks for it;
an MoE checkpoint's ZeRO-0 files (expp_rank_*) one kind of a stage at a time. Each file is parsed once for all
pieces and kinds (tensor_records.FileSections), not loaded whole again for each.
Under the pipeline engine parameter names are the stage's ('tied_modules.embed.x', '<spec position>.y',
checkpoint/parameter_names.py); the tied embedding lives on the first and the last stage, and the first stage's copy is
the one kept. Checkpoints of earlier versions of this project number their pieces from 0 (Checkpoint.old).
"""
import os
from collections import abc
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterator, List, Mapping

import torch

from megatron.checkpoint.file_names import MOMENTS, model_parallel_rank, model_states_file, optimizer_states_file
from megatron.checkpoint.formats import expert_optimizer_state as experts
from megatron.checkpoint.formats import mixed_precision_state as mixed
from megatron.checkpoint.formats import pipeline_engine, universal, zero3
from megatron.checkpoint.formats.checkpoint import Checkpoint, OptimizerState, without_params
from megatron.checkpoint.formats.partitions import adam_tensors, flat_range
from megatron.checkpoint.formats.plain_engine import module_names
from megatron.checkpoint.formats.weight_units import (Progress, StreamedWeights, Units, all_mappable, names_in,
                                                      piece_unit, quiet)
from megatron.checkpoint.parameter_names import model_name
from megatron.checkpoint.shards import join_shards
from megatron.checkpoint.tensor_records import FileSections
from megatron.checkpoint.torch_files import load_file
from megatron.config.flags.optimizer import weight_decayed
from megatron.errors import InputError


# ----------------------------------------------------------------------------- ZeRO 1 / 2

def _zero12_section(contents: Mapping) -> Dict[tuple, torch.Tensor]:
    """{(group, kind): flat tensor} of one data-parallel rank's partition (kind fp32, exp_avg, exp_avg_sq, step)."""
    partition = contents["optimizer_state_dict"]
    tensors = {(group, "fp32"): flat for group, flat in enumerate(partition["single_partition_of_fp32_groups"])}
    return {**tensors, **adam_tensors(partition["base_optimizer_state"]["state"])}


def _zero12_files(checkpoint: Checkpoint) -> FileSections:
    layout, bf16 = checkpoint.layout, checkpoint.flags.bf16
    return FileSections({(mp_rank, dp): os.path.join(checkpoint.directory, optimizer_states_file(mp_rank, dp, bf16))
                         for mp_rank in range(layout.tensor * layout.pipeline) for dp in range(layout.data)},
                        _zero12_section)


def _zero12_placement(checkpoint: Checkpoint, files: FileSections, pp_rank: int, tp_rank: int) -> Dict[str, tuple]:
    """Stage name -> (group, offset in the group's flat buffer, shape, first and step of the data-parallel ranks
    whose partitions make that buffer) of one model-parallel rank's parameters: in flat order, each followed by
    its alignment padding. An MoE group (DeepSpeed's) is partitioned over the ranks holding the same experts:
    with one tensor-parallel rank, every EP-th data-parallel rank from the expert-parallel rank on (DeepSpeed's
    consecutive expert-parallel groups); its local expert indices become global ones."""
    mp_rank = model_parallel_rank(pp_rank, tp_rank, checkpoint.layout.tensor)
    model_states = os.path.join(checkpoint.directory, model_states_file(mp_rank, checkpoint.layout.zero_stage))
    param_shapes = load_file(model_states)["param_shapes"]
    size = checkpoint.flags.expert_parallel
    counts = experts.expert_counts(checkpoint.model)
    partitions = {rank: files.contents((mp_rank, rank))["optimizer_state_dict"] for rank in range(size)}
    placement = {}
    for group, shapes in enumerate(param_shapes):
        moe = partitions[0]["base_optimizer_state"]["param_groups"][group].get("moe")
        for rank in range(size) if moe else (0,):
            paddings = partitions[rank].get("param_alignment_paddings")
            offset = 0
            for (name, shape), padding in zip(shapes.items(), paddings[group] if paddings else [0] * len(shapes)):
                stage = experts.global_name(name, rank, size, counts) if moe else name
                placement[stage] = (group, offset, torch.Size(shape), rank, size if moe else 1)
                offset += torch.Size(shape).numel() + padding
    return placement


def _zero12_read(checkpoint: Checkpoint, files: FileSections, mp_rank: int, placement: Dict[str, tuple], kind: str,
                 names: List[str]) -> Dict[str, torch.Tensor]:
    """`kind` of the parameters `names` of one model-parallel rank: each one's range of its data-parallel ranks'
    partitions (the group's flat buffer cut in consecutive slices), memory-mapped."""
    ranks = {name: range(placement[name][3], checkpoint.layout.data, placement[name][4]) for name in names}
    wanted: Dict[int, dict] = {}  # data-parallel rank -> the flat groups taken from its file
    for name in names:
        for dp in ranks[name]:
            wanted.setdefault(dp, {})[placement[name][0], kind] = None
    taken = {dp: files.take((mp_rank, dp), groups) for dp, groups in wanted.items()}
    result = {}
    for name in names:
        group, offset, shape, _, _ = placement[name]
        flats = [taken[dp][group, kind] for dp in ranks[name]]
        result[name] = flat_range(flats, offset, shape.numel()).view(shape).clone()
    return result


def _zero12_step_and_groups(files: FileSections) -> tuple:
    adam = files.contents((0, 0))["optimizer_state_dict"]["base_optimizer_state"]
    return int(files.scalar((0, 0), adam["state"][0]["step"])), adam["param_groups"]


# ----------------------------------------------------------------------------- ZeRO 0

def decay_groups(names_and_shapes: List[tuple]) -> List[str]:
    """Parameter names in torch's optimizer index order: the weight-decayed matrices, then the rest
    (training/optimizer.parameter_groups; the rule is config/flags/optimizer.weight_decayed)."""
    return ([name for name, shape in names_and_shapes if weight_decayed(shape)] +
            [name for name, shape in names_and_shapes if not weight_decayed(shape)])


def _zero0_files(checkpoint: Checkpoint) -> FileSections:
    """The optimizer's state in each model-parallel rank's model-states file: torch's, or DeepSpeed's fp16/bf16
    wrapper's (mixed_precision_state)."""
    layout = checkpoint.layout
    return FileSections({mp_rank: os.path.join(checkpoint.directory, model_states_file(mp_rank, 0))
                         for mp_rank in range(layout.tensor * layout.pipeline)},
                        lambda contents: adam_tensors(mixed.adam_state(contents["optimizer"])["state"]))


def _rank_groups(checkpoint: Checkpoint, files: FileSections, pp_rank: int, tp_rank: int,
                 layers: Dict[tuple, List[tuple]]) -> List[List[tuple]]:
    """One model-parallel rank's optimizer groups: (stage name, shape) of each member in torch's order (the
    decayed matrices, then the vectors; DeepSpeed drops an empty group). `layers`: as pipeline_engine.stage_parameters
    takes it."""
    if checkpoint.layout.pipeline_engine:
        parameters = pipeline_engine.stage_parameters(checkpoint, pp_rank, tp_rank, layers)
    else:
        module = files.contents(model_parallel_rank(pp_rank, tp_rank, checkpoint.layout.tensor))["module"]
        parameters = [(name, tensor.shape) for name, tensor in module_names(module).items()]
    shapes = dict(parameters)
    groups = ([name for name in decay_groups(parameters) if weight_decayed(shapes[name]) == matrix]
              for matrix in (True, False))
    return [[(name, shapes[name]) for name in group] for group in groups if group]


def _zero0_places(checkpoint: Checkpoint, files: FileSections, pp_rank: int, tp_rank: int,
                  layers: Dict[tuple, List[tuple]]) -> Dict[str, dict]:
    """Stage name -> {kind: its tensor as `files` parsed it (meta)} of one model-parallel rank's parameters that
    have Adam state (a parameter that never had a gradient, the last stage's position embedding, has none in
    fp32); 'fp32' too where a wrapper keeps master weights."""
    mp_rank = model_parallel_rank(pp_rank, tp_rank, checkpoint.layout.tensor)
    groups = _rank_groups(checkpoint, files, pp_rank, tp_rank, layers)
    where = f"{checkpoint.directory}: {model_states_file(mp_rank, 0)}"
    shapes = [[shape for _, shape in group] for group in groups]
    saved = mixed.per_parameter(files.contents(mp_rank)["optimizer"], shapes, where)
    adam, masters = mixed.torch_state(saved), mixed.master_weights(saved)
    order = [name for group in groups for name, _ in group]
    if masters and (len(masters) != len(order) or sum(len(group["params"]) for group in adam["param_groups"]) !=
                    len(order)):
        raise InputError(f"{where} holds the optimizer state of another model than its weights ({len(order)} "
                         f"parameters on model-parallel rank {mp_rank}); convert it with --weights-only")
    return {name: {**adam["state"][index], **({"fp32": masters[index]} if masters else {})}
            for index, name in enumerate(order) if index in adam["state"]}


def _bf16_placement(checkpoint: Checkpoint, files: FileSections, pp_rank: int, tp_rank: int,
                    layers: Dict[tuple, List[tuple]]) -> Dict[str, tuple]:
    """BF16_Optimizer's slices, as _zero12_read takes them: each group's members flat in torch's order, unpadded
    (its mp_rank file records no param_shapes)."""
    placement = {}
    for group, members in enumerate(_rank_groups(checkpoint, files, pp_rank, tp_rank, layers)):
        offset = 0
        for name, shape in members:
            placement[name] = (group, offset, shape, 0, 1)
            offset += shape.numel()
    return placement


def _zero0_read(_checkpoint: Checkpoint, files: FileSections, mp_rank: int, places: Dict[str, dict], kind: str,
                names: List[str]) -> Dict[str, torch.Tensor]:
    """`kind` (a moment, or a wrapper's master weights) of the parameters `names`; `places`: _zero0_places'."""
    return files.read(mp_rank, {name: places[name][kind] for name in names})


def _moe_zero0_read(_checkpoint: Checkpoint, files: FileSections, mp_rank: int, places: Dict[str, dict], kind: str,
                    names: List[str]) -> Dict[str, torch.Tensor]:
    """The plain engine: model-parallel rank = tensor-parallel rank; `places`: {name: {kind: (expert-parallel
    rank, tensor)}} of experts.read_rank_state."""
    by_rank: Dict[int, dict] = {}
    for name in names:
        rank, tensor = places[name][kind]
        by_rank.setdefault(rank, {})[name] = tensor
    result = {}
    for rank, tensors in by_rank.items():
        result.update(files.read((rank, mp_rank), tensors))
    return {name: result[name] for name in names}


def _moe_places(checkpoint: Checkpoint, files: FileSections, tp_rank: int) -> Dict[str, dict]:
    """{name: {kind: (expert-parallel rank, tensor)}} of tensor-parallel rank `tp_rank`'s parameters that have
    Adam moments (experts.read_rank_state's, by name)."""
    state = experts.read_rank_state(checkpoint, files, tp_rank)
    return {name: {kind: by_name[name] for kind, by_name in state.items() if name in by_name}
            for name in state[MOMENTS[0]]}


def _zero0_step_and_groups(files: FileSections) -> tuple:
    adam = mixed.adam_state(files.contents(0)["optimizer"])
    step = files.scalar(0, adam["state"][next(iter(adam["state"]))]["step"]) if adam["state"] else 0
    return int(step), adam["param_groups"]


# ----------------------------------------------------------------------------- assembled

class _AsFloat(abc.Mapping):
    """fp32 training's master weights: the weights, read when asked for."""

    def __init__(self, model: Mapping[str, torch.Tensor]):
        self._model = model

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._model[name].float()

    def __iter__(self) -> Iterator[str]:
        return iter(self._model)

    def __len__(self) -> int:
        return len(self._model)


@dataclass(frozen=True)
class _RankFiles:
    """DeepSpeed's ZeRO 0-2 optimizer files, each parsed once for every kind (tensor_records.FileSections), where
    each model-parallel rank keeps its parameters' state (`where`: (pp, tp) -> stage name -> place, as
    `read` takes it), and which rank holds each GPTModel name (`located`: name -> (pp, stage name))."""
    files: FileSections
    where: Dict[tuple, dict]
    located: Dict[str, tuple]
    read: Callable  # (checkpoint, files, model-parallel rank, its `where`, kind, stage names) -> their tensors
    mappable: bool  # zip-format files: read one model piece at a time
    sliced: bool  # ZeRO 0 under BF16_Optimizer: its state in ZeRO 1's files


def _rank_files(checkpoint: Checkpoint) -> _RankFiles:
    """The checkpoint's files and places, found once for all kinds."""
    layout, num_layers = checkpoint.layout, checkpoint.flags.num_layers
    moe = layout.zero_stage == 0 and checkpoint.moe is not None
    zero0_files = _zero0_files(checkpoint) if layout.zero_stage == 0 and not moe else None
    sliced = zero0_files is not None and mixed.partitioned(zero0_files.contents(0)["optimizer"])
    layers: Dict[tuple, List[tuple]] = {}
    if moe:
        files = experts.rank_files(checkpoint, layout.tensor)
        place, read = lambda pp, tp: _moe_places(checkpoint, files, tp), _moe_zero0_read
    elif sliced:  # BF16_Optimizer's, in ZeRO 1's files
        files = _zero12_files(checkpoint)
        place, read = lambda pp, tp: _bf16_placement(checkpoint, zero0_files, pp, tp, layers), _zero12_read
    elif layout.zero_stage == 0:
        files = zero0_files
        place, read = lambda pp, tp: _zero0_places(checkpoint, files, pp, tp, layers), _zero0_read
    else:
        files = _zero12_files(checkpoint)
        place, read = lambda pp, tp: _zero12_placement(checkpoint, files, pp, tp), _zero12_read
    where, located = {}, {}
    for pp in range(layout.pipeline):
        for tp in range(layout.tensor):
            where[pp, tp] = place(pp, tp)
        for name in where[pp, 0]:
            located.setdefault(model_name(name, num_layers, checkpoint.old), (pp, name))
    mappable = all_mappable(files.paths()) and not moe  # an MoE model's expp files: joined whole, once per kind
    return _RankFiles(files, where, located, read, mappable, sliced)


def _deepspeed_units(checkpoint: Checkpoint, ranks: _RankFiles, kind: str) -> Units:
    """One kind of the Adam state of DeepSpeed's optimizer files (ZeRO 0: in the model-states files; ZeRO 1/2:
    the partitions) under GPTModel's names, tensor-parallel shards joined, one model piece of a pipeline
    stage's memory-mapped files at a time. The tied embedding's first-stage copy is the one kept."""
    layout, num_layers, located = checkpoint.layout, checkpoint.flags.num_layers, ranks.located
    of = {name: piece_unit(ranks.mappable, located.get(name, (0, None))[0], name, num_layers)
          for name in checkpoint.model}

    def read(unit: Hashable) -> dict:
        names, pp = names_in(of, unit), unit[0]
        stage_names = [located[name][1] for name in names if name in located]
        per_tp = [ranks.read(checkpoint, ranks.files, model_parallel_rank(pp, tp, layout.tensor), ranks.where[pp, tp],
                             kind, stage_names) for tp in range(layout.tensor)]
        result = {}
        for name in names:
            if name in located:
                result[name] = join_shards(name, [tensors[located[name][1]] for tensors in per_tp])
            else:  # never stepped: Adam starts it at zero
                result[name] = torch.zeros_like(checkpoint.model[name], dtype=torch.float32)
        return result
    return Units(of, read)


def read_optimizer_state(checkpoint: Checkpoint, progress: Progress = quiet) -> OptimizerState:
    """The checkpoint's Adam state per full parameter (GPTModel names), tensor-parallel shards joined; each
    kind a mapping that reads one model piece at a time when asked for (weight_units.StreamedWeights)."""
    layout = checkpoint.layout
    if not checkpoint.has_optimizer_state:
        raise InputError(f"{checkpoint.directory} holds no optimizer state (saved with --no-save-optim or converted "
                         "with --weights-only); read its weights only")
    if layout.universal:
        return universal.optimizer_state(checkpoint, progress)
    if layout.zero_stage == 3:
        return zero3.optimizer_state(checkpoint, progress)
    lower_precision = checkpoint.flags.precision != "fp32"
    progress("optimizer state: read as each parameter is written")
    ranks = _rank_files(checkpoint)
    kinds = {kind: StreamedWeights(_deepspeed_units(checkpoint, ranks, kind)) for kind in MOMENTS}
    fp32 = (_AsFloat(checkpoint.model) if layout.zero_stage == 0 and not lower_precision  # masters = weights
            else StreamedWeights(_deepspeed_units(checkpoint, ranks, "fp32")))
    moe_zero0 = layout.zero_stage == 0 and checkpoint.moe is not None
    step, groups = (_zero12_step_and_groups if layout.zero_stage or ranks.sliced else experts.step_and_groups
                    if moe_zero0 else _zero0_step_and_groups)(ranks.files)
    if layout.zero_stage or ranks.sliced:
        loss_scale = None  # BF16_Optimizer scales nothing
    else:
        loss_scale = experts.saved_loss_scale(ranks.files) if moe_zero0 else mixed.loss_scale(
            ranks.files.contents(0)["optimizer"], lambda value: ranks.files.scalar(0, value))
    return OptimizerState(step=step, param_groups=without_params(groups), fp32=fp32, **kinds, loss_scale=loss_scale)
