"""The Adam state of a checkpoint, assembled per full parameter: fp32 master weights, first and second
moments and the step count, keyed by GPTModel's names, from whichever layout DeepSpeed wrote (each format's module
reads its own files: zero0.py, zero12.py, zero3.py, universal.py, expert_optimizer_state.py).

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
from collections import abc
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterator, List, Mapping

import torch

from megatron.checkpoint.file_names import MOMENTS, model_parallel_rank
from megatron.checkpoint.formats import expert_optimizer_state as experts
from megatron.checkpoint.formats import mixed_precision_state as mixed
from megatron.checkpoint.formats import universal, zero0, zero3, zero12
from megatron.checkpoint.formats.checkpoint import Checkpoint, OptimizerState, without_params
from megatron.checkpoint.formats.weight_units import (Progress, StreamedWeights, Units, all_mappable, names_in,
                                                      piece_unit, quiet)
from megatron.checkpoint.parameter_names import model_name
from megatron.checkpoint.shards import HALVES, in_halves, join_shards
from megatron.checkpoint.tensor_records import FileSections
from megatron.errors import InputError


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
    zero0_files = zero0.rank_files(checkpoint) if layout.zero_stage == 0 and not moe else None
    sliced = zero0_files is not None and mixed.partitioned(zero0_files.contents(0)["optimizer"])
    layers: Dict[tuple, List[tuple]] = {}
    if moe:
        files = experts.rank_files(checkpoint, layout.tensor)
        place, read = lambda pp, tp: zero0.moe_places(checkpoint, files, tp), zero0.moe_read
    elif sliced:  # BF16_Optimizer's, in ZeRO 1's files
        files = zero12.partition_files(checkpoint)
        place, read = lambda pp, tp: zero0.bf16_placement(checkpoint, zero0_files, pp, tp, layers), zero12.read
    elif layout.zero_stage == 0:
        files = zero0_files
        place, read = lambda pp, tp: zero0.rank_places(checkpoint, files, pp, tp, layers), zero0.read
    else:
        files = zero12.partition_files(checkpoint)
        place, read = lambda pp, tp: zero12.rank_placement(checkpoint, files, pp, tp), zero12.read
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
                joined = join_shards(name, [tensors[located[name][1]] for tensors in per_tp],
                                     swiglu=checkpoint.gate_up == HALVES)
                result[name] = in_halves(name, joined, checkpoint.gate_up)
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
    step, groups = (zero12.step_and_groups if layout.zero_stage or ranks.sliced else experts.step_and_groups
                    if moe_zero0 else zero0.step_and_groups)(ranks.files)
    if layout.zero_stage or ranks.sliced:
        loss_scale = None  # BF16_Optimizer scales nothing
    else:
        loss_scale = experts.saved_loss_scale(ranks.files) if moe_zero0 else mixed.loss_scale(
            ranks.files.contents(0)["optimizer"], lambda value: ranks.files.scalar(0, value))
    return OptimizerState(step=step, param_groups=without_params(groups), fp32=fp32, **kinds, loss_scale=loss_scale)
