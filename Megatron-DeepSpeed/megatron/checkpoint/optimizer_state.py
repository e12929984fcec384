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
  MoE, ZeRO 0    per expert-parallel rank, torch's state_dict of its parameters (expert_optimizer_state.py).
  ZeRO 3         per data-parallel rank, fp32_flat_groups and the Adam state in the same flat layout, every
                 parameter split on its own (reader.zero3_placement), read one model piece at a time.
  universal      (written by writer.py) zero/<engine parameter name>/{fp32,exp_avg,exp_avg_sq,step}.pt, full
                 tensors, and zero/optimizer_state.pt with the hyperparameters.
Under the pipeline engine parameter names are the stage's ('tied_modules.embed.x', '<spec position>.y',
checkpoint/names.py); the tied embedding lives on the first and the last stage, and the first stage's copy is
the one kept. Checkpoints of earlier versions of this project number their pieces from 0 (Checkpoint.old).
"""
import os
from collections import abc
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping

import torch

from megatron.checkpoint import expert_optimizer_state as experts
from megatron.checkpoint.layout import MOMENTS, UNIVERSAL_DIR, layer_file, model_parallel_rank, model_states_file
from megatron.checkpoint.names import (OLD_TIED_PREFIX, TIED_PREFIX, WORD_EMBEDDINGS, model_name,
                                       positions_with_parameters, stage_name)
from megatron.checkpoint.reader import (WHOLE, Checkpoint, Progress, StreamedWeights, _module_names, _quiet, load_file,
                                        padded_rows, zero3_units, zero_optimizer_state)
from megatron.checkpoint.shards import join_shards
from megatron.errors import InputError
from megatron.model.pipe import EMBEDDING_SPEC, final_norm_spec, layer_spec


@dataclass(frozen=True)
class OptimizerState:
    step: int
    fp32: Mapping[str, torch.Tensor]  # master weights
    exp_avg: Mapping[str, torch.Tensor]
    exp_avg_sq: Mapping[str, torch.Tensor]
    param_groups: tuple  # AdamW's hyperparameters per group (decayed, not decayed), without 'params'

    def tensors(self, kind: str) -> Mapping[str, torch.Tensor]:
        return getattr(self, kind)


def _keep_first(target: Dict[str, torch.Tensor], name: str, tensor: torch.Tensor) -> None:
    target.setdefault(name, tensor)


# ----------------------------------------------------------------------------- ZeRO 1 / 2

def _zero12_rank_state(checkpoint: Checkpoint, mp_rank: int, progress: Progress) -> Dict[str, Dict[str, torch.Tensor]]:
    """{kind: {stage parameter name: tensor}} of one model-parallel rank, joined over data-parallel ranks. An MoE
    group (DeepSpeed's) is partitioned over the ranks holding the same experts: with one tensor-parallel rank,
    every EP-th data-parallel rank from the expert-parallel rank on (DeepSpeed's consecutive expert-parallel
    groups); its local expert indices become global ones."""
    tag_dir, layout = checkpoint.directory, checkpoint.layout
    param_shapes = load_file(os.path.join(tag_dir, model_states_file(mp_rank, layout.zero_stage)))["param_shapes"]
    partitions = []
    for dp in range(layout.data):
        progress(f"reading optimizer partition {dp + 1}/{layout.data} of model-parallel rank {mp_rank}")
        partitions.append(zero_optimizer_state(tag_dir, checkpoint.args, mp_rank, dp))
    size = int(checkpoint.args.get("moe_expert_parallel_size") or 1)
    counts = experts.expert_counts(checkpoint.model)
    result = {kind: {} for kind in ("fp32", *MOMENTS)}
    for group, shapes in enumerate(param_shapes):
        if not partitions[0]["base_optimizer_state"]["param_groups"][group].get("moe"):
            _unflatten_group(partitions, group, shapes, result)
            continue
        for rank in range(size):
            _unflatten_group(partitions[rank::size], group, {
                experts.global_name(name, rank, size, counts): shape for name, shape in shapes.items()}, result)
    return result


def _unflatten_group(partitions: List[dict], group: int, shapes: Mapping[str, tuple],
                     result: Dict[str, Dict[str, torch.Tensor]]) -> None:
    """Each parameter of a flat group (`shapes` in flat order) from the group's partitions into `result`."""
    flat = {"fp32": torch.cat([p["single_partition_of_fp32_groups"][group] for p in partitions])}
    for kind in MOMENTS:
        flat[kind] = torch.cat([p["base_optimizer_state"]["state"][group][kind] for p in partitions])
    paddings = partitions[0].get("param_alignment_paddings")
    offset = 0
    for (name, shape), padding in zip(shapes.items(), paddings[group] if paddings else [0] * len(shapes)):
        numel = torch.Size(shape).numel()
        for kind, tensor in flat.items():
            result[kind][name] = tensor.narrow(0, offset, numel).view(shape).clone()
        offset += numel + padding


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


def _zero0_rank_state(checkpoint: Checkpoint, pp_rank: int, tp_rank: int) -> Dict[str, Dict[str, torch.Tensor]]:
    layout = checkpoint.layout
    mp_rank = model_parallel_rank(pp_rank, tp_rank, layout.tensor)
    state = load_file(os.path.join(checkpoint.directory, model_states_file(mp_rank, 0)))
    if layout.pipeline_engine:
        parameters = _pipeline_stage_parameters(checkpoint, pp_rank, tp_rank)
    else:
        parameters = [(name, tensor.shape) for name, tensor in _module_names(state["module"]).items()]
    adam = state["optimizer"]["state"]
    result = {kind: {} for kind in MOMENTS}
    for index, name in enumerate(decay_groups(parameters)):
        if index in adam:  # a parameter that never had a gradient (the last stage's position embedding) has none
            for kind in MOMENTS:
                result[kind][name] = adam[index][kind]
    return result


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

def read_optimizer_state(checkpoint: Checkpoint, progress: Progress = _quiet) -> OptimizerState:
    """The checkpoint's Adam state per full parameter (GPTModel names), tensor-parallel shards joined."""
    layout, args = checkpoint.layout, checkpoint.args
    if not checkpoint.has_optimizer_state:
        raise InputError(f"{checkpoint.directory} holds no optimizer state (saved with --no-save-optim or converted "
                         "with --weights-only); read its weights only")
    num_layers = int(args["num_layers"])
    if layout.universal:
        return _universal_state(checkpoint, progress)
    if layout.zero_stage == 3:
        return _zero3_state(checkpoint, progress)
    if layout.zero_stage == 0 and (args.get("bf16") or args.get("fp16")):
        raise InputError(f"{checkpoint.directory}: the optimizer state of ZeRO stage 0 with --bf16/--fp16 is kept "
                         "in DeepSpeed's mixed-precision optimizer format, which cannot be reshaped; convert with "
                         "--weights-only")
    per_tp = []  # per tensor-parallel rank: {kind: {GPTModel name: tensor}}
    for tp in range(layout.tensor):
        joined = {kind: {} for kind in ("fp32", *MOMENTS)}
        for pp in range(layout.pipeline):
            if layout.zero_stage == 0 and checkpoint.moe is not None:
                rank_state = experts.read_rank_moments(checkpoint, tp)
            elif layout.zero_stage == 0:
                rank_state = _zero0_rank_state(checkpoint, pp, tp)
            else:
                rank_state = _zero12_rank_state(checkpoint, model_parallel_rank(pp, tp, layout.tensor), progress)
            for kind, tensors in rank_state.items():
                for name, tensor in tensors.items():
                    _keep_first(joined[kind], model_name(name, num_layers, checkpoint.old), tensor)
        per_tp.append(joined)
    full = {kind: {} for kind in ("fp32", *MOMENTS)}
    for kind in full:
        for name in checkpoint.model:
            if kind == "fp32" and layout.zero_stage == 0:  # fp32 training: the master weights are the weights
                full[kind][name] = checkpoint.model[name].float()
            elif name in per_tp[0][kind]:
                full[kind][name] = join_shards(name, [joined[kind][name] for joined in per_tp])
            else:  # never stepped: Adam starts it at zero
                full[kind][name] = torch.zeros_like(checkpoint.model[name], dtype=torch.float32)
    step, groups = (_zero12_step_and_groups if layout.zero_stage else experts.step_and_groups
                    if checkpoint.moe is not None else _zero0_step_and_groups)(checkpoint)
    return OptimizerState(step=step, param_groups=_without_params(groups), **full)
