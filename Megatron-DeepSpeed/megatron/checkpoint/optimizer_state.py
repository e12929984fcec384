"""The Adam state of a checkpoint, assembled per full parameter: fp32 master weights, first and second
moments and the step count, keyed by GPTModel's names, from whichever layout DeepSpeed wrote.

  ZeRO 0 (fp32)  torch's optimizer state_dict in each model-parallel rank's mp_rank file: state by parameter
                 index, counted over the parameter groups (decayed matrices, then vectors, see
                 megatron/training/optimizer.py) in the order of that rank's module parameters; the master weights
                 are the weights.
  ZeRO 1 / 2     per data-parallel rank, the rank's slice of each group's flat fp32 buffer
                 (single_partition_of_fp32_groups, group padding stripped) and of the Adam state (padded);
                 the group's parameters, in flat order, are `param_shapes` in the mp_rank file, each
                 followed by its alignment padding (param_alignment_paddings). DeepSpeed's MoE groups are
                 partitioned over the ranks that hold the same experts instead.
  MoE, ZeRO 0    per expert-parallel rank, torch's state_dict of its parameters; in fp16/bf16 wrapped by
                 DeepSpeed's FP16_UnfusedOptimizer with the master weights and the loss scale
                 (expert_optimizer_state.py).
  ZeRO 3         per data-parallel rank, fp32_flat_groups and the Adam state in the same flat layout, every
                 parameter split on its own (reader.zero3_placement).
  universal      (written by writer.py) zero/<engine parameter name>/{fp32,exp_avg,exp_avg_sq,step}.pt, full
                 tensors, and zero/optimizer_state.pt with the hyperparameters.
Every layout is read one model piece (one parameter file) at a time, memory-mapped, when the writer asks for it;
an MoE checkpoint's ZeRO-0 files (expp_rank_*) one kind of a stage at a time.
Under the pipeline engine parameter names are the stage's ('tied_modules.embed.x', '<spec position>.y',
checkpoint/names.py); the tied embedding lives on the first and the last stage, and the first stage's copy is
the one kept. Checkpoints of earlier versions of this project number their pieces from 0 (Checkpoint.old).
"""
import os
from collections import abc
from dataclasses import dataclass
from typing import Dict, Hashable, Iterator, List, Mapping, Optional

import torch

from megatron.checkpoint import expert_optimizer_state as experts
from megatron.checkpoint.directory import load_file
from megatron.checkpoint.layout import (MOMENTS, UNIVERSAL_DIR, layer_file, model_parallel_rank, model_states_file,
                                        optimizer_states_file)
from megatron.checkpoint.names import (OLD_TIED_PREFIX, TIED_PREFIX, WORD_EMBEDDINGS, model_name,
                                       positions_with_parameters, stage_name)
from megatron.checkpoint.reader import (Checkpoint, flat_range, module_names, padded_rows, zero3_units,
                                        zero_optimizer_state)
from megatron.checkpoint.shards import join_shards
from megatron.checkpoint.weight_units import (WHOLE, Progress, StreamedWeights, Units, all_mappable, names_in,
                                              piece_unit, quiet)
from megatron.errors import InputError
from megatron.model.pipe import EMBEDDING_SPEC, final_norm_spec, layer_spec


@dataclass(frozen=True)
class OptimizerState:
    step: int
    fp32: Mapping[str, torch.Tensor]  # master weights
    exp_avg: Mapping[str, torch.Tensor]
    exp_avg_sq: Mapping[str, torch.Tensor]
    param_groups: tuple  # AdamW's hyperparameters per group (decayed, not decayed), without 'params'
    loss_scale: Optional[Mapping] = None  # an fp16/bf16 MoE run's at ZeRO 0 (expert_optimizer_state.LOSS_SCALE_KEYS)

    def tensors(self, kind: str) -> Mapping[str, torch.Tensor]:
        return getattr(self, kind)


# ----------------------------------------------------------------------------- ZeRO 1 / 2

def _zero12_placement(checkpoint: Checkpoint, mp_rank: int) -> Dict[str, tuple]:
    """Stage name -> (group, offset in the group's flat buffer, shape, first and step of the data-parallel ranks
    whose partitions make that buffer) of one model-parallel rank's parameters: in flat order, each followed by
    its alignment padding. An MoE group (DeepSpeed's) is partitioned over the ranks holding the same experts:
    with one tensor-parallel rank, every EP-th data-parallel rank from the expert-parallel rank on (DeepSpeed's
    consecutive expert-parallel groups); its local expert indices become global ones."""
    tag_dir, args = checkpoint.directory, checkpoint.args
    param_shapes = load_file(os.path.join(tag_dir, model_states_file(mp_rank, checkpoint.layout.zero_stage)))[
        "param_shapes"]
    size = int(args.get("moe_expert_parallel_size") or 1)
    counts = experts.expert_counts(checkpoint.model)
    first = zero_optimizer_state(tag_dir, args, mp_rank, 0)
    placement = {}
    for group, shapes in enumerate(param_shapes):
        moe = first["base_optimizer_state"]["param_groups"][group].get("moe")
        for rank in range(size) if moe else (0,):
            paddings = zero_optimizer_state(tag_dir, args, mp_rank, rank).get("param_alignment_paddings")
            offset = 0
            for (name, shape), padding in zip(shapes.items(), paddings[group] if paddings else [0] * len(shapes)):
                stage = experts.global_name(name, rank, size, counts) if moe else name
                placement[stage] = (group, offset, torch.Size(shape), rank, size if moe else 1)
                offset += torch.Size(shape).numel() + padding
    return placement


def _zero12_read(checkpoint: Checkpoint, mp_rank: int, placement: Dict[str, tuple], kind: str,
                 names: List[str]) -> Dict[str, torch.Tensor]:
    """`kind` of the parameters `names` of one model-parallel rank: each one's range of its data-parallel ranks'
    partitions (the group's flat buffer cut in consecutive slices), memory-mapped."""
    partitions = [zero_optimizer_state(checkpoint.directory, checkpoint.args, mp_rank, dp)
                  for dp in range(checkpoint.layout.data)]
    result = {}
    for name in names:
        group, offset, shape, first, step = placement[name]
        flats = [p["single_partition_of_fp32_groups"][group] if kind == "fp32" else
                 p["base_optimizer_state"]["state"][group][kind] for p in partitions[first::step]]
        result[name] = flat_range(flats, offset, shape.numel()).view(shape).clone()
    return result


def _zero12_step_and_groups(checkpoint: Checkpoint) -> tuple:
    adam = zero_optimizer_state(checkpoint.directory, checkpoint.args, 0, 0)["base_optimizer_state"]
    return int(adam["state"][0]["step"]), adam["param_groups"]


# ----------------------------------------------------------------------------- ZeRO 3

def _zero3_state(checkpoint: Checkpoint, progress: Progress) -> OptimizerState:
    """Each kind read one model piece at a time when asked for (reader.zero3_units), as the weights are."""
    progress("ZeRO-3 optimizer state: read as each parameter is written")
    layout, args = checkpoint.layout, checkpoint.args
    kinds = {kind: StreamedWeights(zero3_units(checkpoint.directory, layout, args, int(args["num_layers"]), WHOLE,
                                               kind)) for kind in ("fp32", *MOMENTS)}
    step, groups = _zero3_step_and_groups(checkpoint)
    return OptimizerState(step=step, param_groups=_without_params(groups), **kinds)


def _zero3_step_and_groups(checkpoint: Checkpoint) -> tuple:
    adam = zero_optimizer_state(checkpoint.directory, checkpoint.args, 0, 0)["optimizer_state_dict"]
    return int(adam["state"][0]["step"]), adam["param_groups"]


# ----------------------------------------------------------------------------- ZeRO 0

def decay_groups(names_and_shapes: List[tuple]) -> List[str]:
    """Parameter names in torch's optimizer index order: the weight-decayed matrices, then the vectors
    (megatron/optimizer.parameter_groups)."""
    return ([name for name, shape in names_and_shapes if len(shape) > 1] +
            [name for name, shape in names_and_shapes if len(shape) <= 1])


def pipeline_stage_pieces(num_layers: int, stages: int, old: bool = False) -> List[range]:
    """The spec positions (DeepSpeed layer numbers) each pipeline stage holds, as GPTPipe partitions them:
    balanced over transformer layers (model/pipe.py's partition_method). `old`: as earlier versions of this
    project built the pipeline (embedding 0, layers 1..L, final LayerNorm, LM head)."""
    from deepspeed.runtime.utils import partition_balanced

    first, specs = (1, num_layers + 3) if old else (layer_spec(0), final_norm_spec(num_layers) + 2)
    weights = [1 if first <= spec < first + num_layers else 0 for spec in range(specs)]
    parts = partition_balanced(weights=weights, num_parts=stages)
    return [range(parts[stage], parts[stage + 1]) for stage in range(stages)]


def _pipeline_stage_parameters(checkpoint: Checkpoint, stage: int, tp_rank: int) -> List[tuple]:
    """(stage name, shape) of one pipeline stage's parameters in module order: the tied embedding first (on the
    first and last stage), then each piece's."""
    num_layers, old = int(checkpoint.args["num_layers"]), checkpoint.old
    stage_pieces = pipeline_stage_pieces(num_layers, checkpoint.layout.pipeline, old)
    tied_piece = stage_pieces[-1][-1]
    embedding_piece = 0 if old else EMBEDDING_SPEC
    with_parameters = range(num_layers + 2) if old else positions_with_parameters(num_layers)
    embedding = load_file(os.path.join(checkpoint.directory, layer_file(embedding_piece, tp_rank)))
    parameters = []
    if embedding_piece in stage_pieces[stage] or tied_piece in stage_pieces[stage]:
        parameters += [((OLD_TIED_PREFIX if old else TIED_PREFIX) + key, tensor.shape)
                       for key, tensor in embedding.items()]
    for piece in stage_pieces[stage]:
        if piece in (embedding_piece, tied_piece) or piece not in with_parameters:
            continue
        layer = load_file(os.path.join(checkpoint.directory, layer_file(piece, tp_rank)))
        parameters += [(f"{piece}.{key}", tensor.shape) for key, tensor in layer.items()]
    return parameters


def _zero0_index(checkpoint: Checkpoint, pp_rank: int, tp_rank: int) -> Dict[str, int]:
    """Stage name -> torch's optimizer index of one model-parallel rank's parameters that have Adam state (a
    parameter that never had a gradient, the last stage's position embedding, has none)."""
    mp_rank = model_parallel_rank(pp_rank, tp_rank, checkpoint.layout.tensor)
    state = load_file(os.path.join(checkpoint.directory, model_states_file(mp_rank, 0)))
    if checkpoint.layout.pipeline_engine:
        parameters = _pipeline_stage_parameters(checkpoint, pp_rank, tp_rank)
    else:
        parameters = [(name, tensor.shape) for name, tensor in module_names(state["module"]).items()]
    adam = state["optimizer"]["state"]
    return {name: index for index, name in enumerate(decay_groups(parameters)) if index in adam}


def _zero0_read(checkpoint: Checkpoint, mp_rank: int, index: Dict[str, int], kind: str,
                names: List[str]) -> Dict[str, torch.Tensor]:
    adam = load_file(os.path.join(checkpoint.directory, model_states_file(mp_rank, 0)))["optimizer"]["state"]
    return {name: adam[index[name]][kind] for name in names}


def _moe_zero0_read(checkpoint: Checkpoint, mp_rank: int, _names: Dict[str, str], kind: str,
                    names: List[str]) -> Dict[str, torch.Tensor]:
    moments = experts.read_rank_state(checkpoint, mp_rank)[kind]  # the plain engine: mp rank = tp rank
    return {name: moments[name] for name in names}


def _zero0_step_and_groups(checkpoint: Checkpoint) -> tuple:
    adam = load_file(os.path.join(checkpoint.directory, model_states_file(0, 0)))["optimizer"]
    return (int(next(iter(adam["state"].values()))["step"]) if adam["state"] else 0), adam["param_groups"]


# ----------------------------------------------------------------------------- universal

class _UniversalKind(abc.Mapping):
    """One kind of a universal checkpoint's Adam state (fp32, exp_avg or exp_avg_sq) under GPTModel's names,
    each parameter's file read (memory-mapped) when asked for and not kept: a converter writing one file at a
    time never holds the whole state."""

    def __init__(self, checkpoint: Checkpoint, kind: str):
        self._checkpoint, self._kind = checkpoint, kind

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._checkpoint.model:
            raise KeyError(name)
        tensor = load_file(os.path.join(_universal_folder(self._checkpoint, name), f"{self._kind}.pt"))["param"]
        # ds_to_universal strips the vocabulary padding; the other tensors are whole
        return padded_rows(tensor, self._checkpoint.padded_vocab_size) if name == WORD_EMBEDDINGS else tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._checkpoint.model)

    def __len__(self) -> int:
        return len(self._checkpoint.model)


def _universal_folder(checkpoint: Checkpoint, name: str) -> str:
    engine_name = stage_name(name, int(checkpoint.args["num_layers"])) if checkpoint.layout.pipeline_engine else name
    return os.path.join(checkpoint.directory, UNIVERSAL_DIR, engine_name)


def _universal_state(checkpoint: Checkpoint, progress: Progress) -> OptimizerState:
    names = list(checkpoint.model)
    progress(f"per-parameter optimizer state of {len(names)} parameters: read as each is written")
    step_file = load_file(os.path.join(_universal_folder(checkpoint, names[-1]), "step.pt"))
    step = int(step_file["param"] if isinstance(step_file, dict) else step_file)  # ds_to_universal's: {'param': step}
    return OptimizerState(step=step, param_groups=default_param_groups(checkpoint.args),
                          **{kind: _UniversalKind(checkpoint, kind) for kind in ("fp32", *MOMENTS)})


def default_param_groups(args: Mapping[str, object]) -> tuple:
    """AdamW's two parameter groups (decayed, not decayed) with the hyperparameters of the recorded flags."""
    common = {"lr": args.get("lr", 0.0), "betas": (args.get("adam_beta1", 0.9), args.get("adam_beta2", 0.999)),
              "eps": args.get("adam_eps", 1e-8)}
    return {**common, "weight_decay": args.get("weight_decay", 0.01)}, {**common, "weight_decay": 0.0}


def _without_params(groups) -> tuple:
    return tuple({key: value for key, value in group.items() if key != "params"} for group in groups)


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


def _deepspeed_units(checkpoint: Checkpoint, kind: str) -> Units:
    """One kind of the Adam state of DeepSpeed's optimizer files (ZeRO 0: in the model-states files; ZeRO 1/2:
    the partitions) under GPTModel's names, tensor-parallel shards joined, one model piece of a pipeline
    stage's memory-mapped files at a time. The tied embedding's first-stage copy is the one kept."""
    layout, num_layers = checkpoint.layout, int(checkpoint.args["num_layers"])
    zero0, moe = layout.zero_stage == 0, layout.zero_stage == 0 and checkpoint.moe is not None
    rank_reader = _moe_zero0_read if moe else _zero0_read if zero0 else _zero12_read
    where, located = {}, {}  # (pp, tp) -> the rank's parameters; GPTModel name -> (pp, stage name)
    for pp in range(layout.pipeline):
        for tp in range(layout.tensor):
            mp_rank = model_parallel_rank(pp, tp, layout.tensor)
            where[pp, tp] = ({name: name for name in experts.read_rank_state(checkpoint, tp)[MOMENTS[0]]} if moe
                             else _zero0_index(checkpoint, pp, tp) if zero0 else _zero12_placement(checkpoint, mp_rank))
        for name in where[pp, 0]:
            located.setdefault(model_name(name, num_layers, checkpoint.old), (pp, name))
    paths = [os.path.join(checkpoint.directory, model_states_file(mp_rank, 0) if zero0 else
                          optimizer_states_file(mp_rank, dp, bool(checkpoint.args.get("bf16"))))
             for mp_rank in range(layout.tensor * layout.pipeline) for dp in range(1 if zero0 else layout.data)]
    mappable = all_mappable(paths) and not moe  # an MoE model's expp files: joined whole, once per kind
    of = {name: piece_unit(mappable, located.get(name, (0, None))[0], name, num_layers) for name in checkpoint.model}

    def read(unit: Hashable) -> dict:
        names, pp = names_in(of, unit), unit[0]
        stage_names = [located[name][1] for name in names if name in located]
        per_tp = [rank_reader(checkpoint, model_parallel_rank(pp, tp, layout.tensor), where[pp, tp], kind, stage_names)
                  for tp in range(layout.tensor)]
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
    layout, args = checkpoint.layout, checkpoint.args
    if not checkpoint.has_optimizer_state:
        raise InputError(f"{checkpoint.directory} holds no optimizer state (saved with --no-save-optim or converted "
                         "with --weights-only); read its weights only")
    if layout.universal:
        return _universal_state(checkpoint, progress)
    if layout.zero_stage == 3:
        return _zero3_state(checkpoint, progress)
    mixed = bool(args.get("bf16") or args.get("fp16"))
    if layout.zero_stage == 0 and mixed and checkpoint.moe is None:
        raise InputError(f"{checkpoint.directory}: the optimizer state of ZeRO stage 0 with --bf16/--fp16 is kept "
                         "in DeepSpeed's mixed-precision optimizer format, which cannot be reshaped; convert with "
                         "--weights-only")
    progress("optimizer state: read as each parameter is written")
    kinds = {kind: StreamedWeights(_deepspeed_units(checkpoint, kind)) for kind in MOMENTS}
    fp32 = (_AsFloat(checkpoint.model) if layout.zero_stage == 0 and not mixed  # the master weights are the weights
            else StreamedWeights(_deepspeed_units(checkpoint, "fp32")))
    moe_zero0 = layout.zero_stage == 0 and checkpoint.moe is not None
    step, groups = (_zero12_step_and_groups if layout.zero_stage else experts.step_and_groups
                    if moe_zero0 else _zero0_step_and_groups)(checkpoint)
    return OptimizerState(step=step, param_groups=_without_params(groups), fp32=fp32, **kinds,
                          loss_scale=experts.saved_loss_scale(checkpoint) if moe_zero0 else None)
