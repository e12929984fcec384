"""The Adam state of a mixture-of-experts checkpoint, which DeepSpeed keeps per expert-parallel rank. At ZeRO
stage 0 it is in expp_rank_{r}_mp_rank_{mp:02d}_optim_states.pt = {'optimizer': the engine's optimizer's
state_dict}. Each file covers that rank's parameters: the dense ones (the same on every rank) and its own experts.
Reading joins the files into one state per full parameter (the single-process model's names, global expert
indices). Writing cuts that state for another expert-parallel size, so a run resumed there takes the source run's
next steps. ZeRO 1-2's flat partitions are read by optimizer_state.py, with the expert naming kept here.

What DeepSpeed 0.19.8 puts in 'optimizer', as read from its code and from checkpoints this trainer saved (tiny
MoE, EP 2 x DP 2, gloo; the wrappers' forms are read by mixed_precision_state.py, shared with dense models):
  fp32, ZeRO 0   torch's AdamW state_dict (the engine wraps nothing: engine.py _do_optimizer_sanity_check
                 returns no wrapper when the model and gradient dtypes are fp32).
  fp16 or bf16, ZeRO 0   DeepSpeed's FP16_UnfusedOptimizer.state_dict (runtime/fp16/unfused_optimizer.py): our
                 AdamW is torch's, not DeepSpeed's FusedAdam, so engine.py _configure_fp16_optimizer picks the
                 unfused wrapper, for bf16 too (_do_optimizer_sanity_check: DDP_BFLOAT16 when the gradients
                 accumulate in bf16, the default; BF16_Optimizer only for the pipeline engine or ZeRO 1 with
                 fp32 gradient accumulation). Keys: 'dynamic_loss_scale', 'cur_scale', 'cur_iter' (steps taken)
                 and, with a dynamic scale, 'last_overflow_iter', 'scale_factor', 'scale_window' (bf16: False,
                 1.0, steps; fp16: dynamic unless --loss-scale); 'optimizer_state_dict', torch's AdamW
                 state_dict of the fp32 master copies, numbered as in fp32; 'fp32_groups', the master copies
                 themselves, one list per parameter group in that order, no padding. load_state_dict copies the
                 master weights from 'fp32_groups' (not from the bf16/fp16 module) and restores the loss scale.
                 Upstream's trainer steps fp16 with DeepSpeed's FusedAdam, which gets FP16_Optimizer
                 (runtime/fp16/fused_optimizer.py) instead: the same loss-scale keys, but each group one flat
                 parameter, its members concatenated without padding ('fp32_groups_flat'); read, not written.
  ZeRO 1-2       None: the state is in [bf16_]zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt per data-parallel
                 rank (optimizer_state.py), which the engine reloads only at the data-parallel size that saved
                 them (engine.py _load_zero_checkpoint).
The engine saves 'optimizer' on each expert-parallel rank's first expert-data-parallel rank
(engine.py _save_moe_checkpoint) and loads it at ZeRO 0 from the file of its own expert-parallel rank, whatever
the data-parallel size (engine.py _load_checkpoint: optimizer.load_state_dict(...)). So the converter writes the
ZeRO 0 form of the target's precision; DeepSpeed's ZeRO 1-2 loaders read no expp_rank file.

torch numbers a state_dict's parameters in group order, and within each group in module order. Our groups
(training/optimizer.py) are the decayed matrices and then the rest. DeepSpeed's MoE groups
(--create-moe-param-group, or ZeRO 1-2) move the experts into groups of their own at the end, decayed then not,
each cut at DeepSpeed's group size limit. In module order a layer's experts follow its gate: DeepSpeed's MoE
registers the gate, then the experts, then PR-MoE's MLP and coefficient.
"""
import os
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import torch

from megatron.checkpoint.formats import mixed_precision_state as mixed
from megatron.checkpoint.file_names import EXPERT_KEY_PATTERN, MOMENTS, expert_optimizer_file
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.partitions import adam_tensors
from megatron.checkpoint.shards import shard_of
from megatron.checkpoint.tensor_records import FileSections
from megatron.errors import InputError

GATE_SUFFIX = ".deepspeed_moe.gate.wg.weight"
# max_group_size of DeepSpeed's split_params_into_different_moe_groups_for_optimizer (deepspeed/moe/utils.py)
EXPERT_GROUP_LIMIT = 178_956_971


def module_order(names: Sequence[str]) -> List[str]:
    """`names` (the dense ones in module order, the experts anywhere) in MoEGPTModel's module order."""
    experts: Dict[int, List[tuple]] = {}
    dense = []
    for name in names:
        match = EXPERT_KEY_PATTERN.search(name)
        if match:
            experts.setdefault(int(match.group(1)), []).append((int(match.group(2)), name))
        else:
            dense.append(name)
    ordered = []
    for name in dense:
        ordered.append(name)
        if name.endswith(GATE_SUFFIX):  # sorted() is stable: each expert's parameters keep their order
            ordered += [expert for _, expert in sorted(experts.pop(int(name.split(".")[1])), key=lambda e: e[0])]
    return ordered


def expert_counts(names: Iterable[str]) -> Dict[int, int]:
    """{transformer layer: its number of experts} of a model's parameter names (global expert indices)."""
    indices: Dict[int, set] = {}
    for name in names:
        if match := EXPERT_KEY_PATTERN.search(name):
            indices.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    return {layer: len(experts) for layer, experts in indices.items()}


def global_name(name: str, expert_parallel_rank: int, expert_parallel_size: int, counts: Mapping[int, int]) -> str:
    """A parameter's name on rank `expert_parallel_rank` (local expert index) as the single-process model names it."""
    match = EXPERT_KEY_PATTERN.search(name)
    if not match:
        return name
    first = expert_parallel_rank * counts[int(match.group(1))] // expert_parallel_size
    start, end = match.span(2)
    return f"{name[:start]}{first + int(match.group(2))}{name[end:]}"


def rank_names(ordered: Sequence[str], expert_parallel_rank: int, expert_parallel_size: int) -> List[str]:
    """The parameters (global names, module order) that rank `expert_parallel_rank` of `expert_parallel_size`
    holds: every dense one and, in each MoE layer, its consecutive share of the experts."""
    counts = expert_counts(ordered)

    def held(name: str) -> bool:
        match = EXPERT_KEY_PATTERN.search(name)
        return not match or int(match.group(2)) * expert_parallel_size // counts[int(match.group(1))] == \
            expert_parallel_rank
    return [name for name in ordered if held(name)]


def _classes(expert_groups: bool) -> List[tuple]:
    """The optimizer's groups in order, as (expert: True, False or None for either; matrix)."""
    return [(False, True), (False, False), (True, True), (True, False)] if expert_groups else [(None, True),
                                                                                               (None, False)]


def _members(names: Sequence[str], is_matrix: Callable[[str], bool], expert, matrix: bool) -> List[str]:
    return [name for name in names if is_matrix(name) == matrix
            and (expert is None or bool(EXPERT_KEY_PATTERN.search(name)) == expert)]


def state_order(names: Sequence[str], is_matrix: Callable[[str], bool], expert_groups: bool) -> List[str]:
    """`names` (one rank's, module order) in the order torch numbers their optimizer state."""
    return [name for expert, matrix in _classes(expert_groups) for name in _members(names, is_matrix, expert, matrix)]


def expert_groups_of(param_groups: Sequence[Mapping]) -> bool:
    """Whether an optimizer's groups include DeepSpeed's MoE groups."""
    return any(group.get("moe") for group in param_groups)


def rank_files(checkpoint: Checkpoint, tp_size: int) -> FileSections:
    """The expp_rank file of each (expert-parallel rank, tensor-parallel rank), each checked to be there; each
    parsed once, when first read (tensor_records), its tensors then read as they are asked for."""
    paths = {}
    for rank in range(checkpoint.flags.expert_parallel):
        for tp_rank in range(tp_size):
            paths[rank, tp_rank] = os.path.join(checkpoint.directory, expert_optimizer_file(rank, tp_rank))
            if not os.path.isfile(paths[rank, tp_rank]):
                raise InputError(f"{checkpoint.directory} lacks {os.path.basename(paths[rank, tp_rank])}, the "
                                 f"optimizer state of expert-parallel rank {rank}; convert it with --weights-only")
    return FileSections(paths, lambda contents: adam_tensors(mixed.torch_state(contents["optimizer"])["state"]))


def read_rank_state(checkpoint: Checkpoint, files: FileSections, tp_rank: int) -> Dict[str, Dict[str, tuple]]:
    """{kind: {global name: (expert-parallel rank, tensor)}} of the Adam moments of tensor-parallel rank `tp_rank`,
    joined over the expert-parallel ranks (a parameter that never had a gradient has none), and under 'fp32' the
    master weights of an fp16/bf16 run (an fp32 run's are its weights: none here). The tensors are as `files`
    (rank_files') parsed them, on the meta device: files.read((rank, tp_rank), ...) gives their values."""
    size = checkpoint.flags.expert_parallel
    ordered = module_order(list(checkpoint.model))
    result = {kind: {} for kind in ("fp32", *MOMENTS)}
    for rank in range(size):
        saved = files.contents((rank, tp_rank))["optimizer"]
        adam = mixed.torch_state(saved)
        expert_groups = expert_groups_of(adam["param_groups"])
        order = state_order(rank_names(ordered, rank, size), lambda name: checkpoint.model[name].dim() > 1,
                            expert_groups)
        shapes = [[checkpoint.model[name].shape for name in members]
                  for _, members in rank_groups(checkpoint.model, adam["param_groups"], expert_groups, rank, size)]
        saved = mixed.per_parameter(saved, shapes, f"{checkpoint.directory}: {expert_optimizer_file(rank, tp_rank)}")
        adam, masters = mixed.torch_state(saved), mixed.master_weights(saved)
        if sum(len(group["params"]) for group in adam["param_groups"]) != len(order) or \
                len(masters) not in (0, len(order)):
            raise InputError(f"{checkpoint.directory}: {expert_optimizer_file(rank, tp_rank)} holds the state of "
                             f"another model than its weights ({len(order)} parameters on expert-parallel rank "
                             f"{rank}); convert it with --weights-only")
        for index, name in enumerate(order):
            for kind in MOMENTS if index in adam["state"] else ():
                result[kind].setdefault(name, (rank, adam["state"][index][kind]))
            if masters:
                result["fp32"].setdefault(name, (rank, masters[index]))
    return result


def step_and_groups(files: FileSections) -> tuple:
    """The step count and the groups' hyperparameters (expert-parallel rank 0's; `files`: rank_files')."""
    adam = mixed.torch_state(files.contents((0, 0))["optimizer"])
    step = files.scalar((0, 0), next(iter(adam["state"].values()))["step"]) if adam["state"] else 0
    return int(step), adam["param_groups"]


def saved_loss_scale(files: FileSections) -> Optional[dict]:
    """The loss scale an fp16/bf16 run saved at ZeRO 0 (expert-parallel rank 0's; every rank steps the same
    scale), or None for an fp32 run; `files`: rank_files'."""
    return mixed.loss_scale(files.contents((0, 0))["optimizer"], lambda value: files.scalar((0, 0), value))


def rank_groups(model: Mapping[str, torch.Tensor], param_groups: Sequence[Mapping], expert_groups: bool,
                expert_parallel_rank: int, expert_parallel_size: int) -> List[tuple]:
    """(hyperparameters, the member names in torch's order) of each optimizer group on expert-parallel rank
    `expert_parallel_rank`: the dense groups' hyperparameters are `param_groups`' first two and, with
    `expert_groups`, the experts' groups are DeepSpeed's (its name, 'moe', its size limit)."""
    names = rank_names(module_order(list(model)), expert_parallel_rank, expert_parallel_size)

    def is_matrix(name: str) -> bool:
        return model[name].dim() > 1
    groups = []
    for expert, matrix in _classes(expert_groups):
        hyper = {**param_groups[0 if matrix else 1]}
        if expert:
            hyper.update(name=f"ep_size_{expert_parallel_size}", moe=True)
        for chunk in _chunks(_members(names, is_matrix, expert, matrix), model, EXPERT_GROUP_LIMIT if expert else None):
            groups.append((hyper, chunk))
    return groups


def rank_optimizer(model: Mapping[str, torch.Tensor], optimizer, expert_groups: bool, expert_parallel_rank: int,
                   expert_parallel_size: int, tp_rank: int, tp_size: int, split_experts: bool = False,
                   loss_scale: Optional[Mapping] = None, swiglu: bool = False) -> dict:
    """{'optimizer': ...} as DeepSpeed reads it from one target rank's expp_rank file, from `optimizer` (an
    optimizer_state.OptimizerState of the full model): torch's AdamW state_dict, or with `loss_scale` (an
    fp16/bf16 target, mixed_precision_state.target_loss_scale) FP16_UnfusedOptimizer's form
    (mixed_precision_state.zero0_state). Groups as rank_groups makes them; moments and master weights are this
    tensor-parallel rank's shards, cut as its weights are (`split_experts`: the experts and PR-MoE's dense MLP
    too; `swiglu`: SwiGLU MLPs)."""
    def shard(kind: str, name: str) -> torch.Tensor:
        return shard_of(name, optimizer.tensors(kind)[name], tp_rank, tp_size, split_experts, swiglu)
    groups = rank_groups(model, optimizer.param_groups, expert_groups, expert_parallel_rank, expert_parallel_size)
    return {"optimizer": mixed.zero0_state(groups, shard, optimizer.step, loss_scale)}


def _chunks(names: List[str], model: Mapping[str, torch.Tensor], limit) -> List[List[str]]:
    """`names` cut as DeepSpeed cuts an MoE group: a new group whenever the next parameter would pass `limit`
    elements (None: one group); an empty class makes no group."""
    chunks: List[List[str]] = []
    size = 0
    for name in names:
        numel = model[name].numel()
        if not chunks or (limit is not None and size + numel > limit):
            chunks.append([])
            size = 0
        chunks[-1].append(name)
        size += numel
    return chunks

