"""DeepSpeed's ZeRO stage 0: the optimizer's state in each model-parallel rank's mp_rank_{mp:02d}_model_states.pt,
torch's optimizer state_dict by parameter index, counted over the parameter groups (the decayed matrices, then the
rest: config/flags/optimizer.weight_decayed) in the order of that rank's module parameters; in fp16/bf16 DeepSpeed's
wrapper's form (mixed_precision_state.py), on the pipeline engine in bf16 BF16_Optimizer's data-parallel slices
(read as ZeRO 1's, bf16_placement); an MoE model's in its per-expert-parallel-rank expp_rank files
(expert_optimizer_state.py). The weights are the engine's files' (pipeline_engine, plain_engine); here the Adam
state, as optimizer_state's DeepSpeed units read it."""
import os
from typing import Dict, List

import torch

from megatron.checkpoint.file_names import MOMENTS, model_parallel_rank, model_states_file
from megatron.checkpoint.formats import expert_optimizer_state as experts
from megatron.checkpoint.formats import mixed_precision_state as mixed
from megatron.checkpoint.formats import pipeline_engine
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.partitions import adam_tensors
from megatron.checkpoint.formats.plain_engine import module_names
from megatron.checkpoint.tensor_records import FileSections
from megatron.config.flags.optimizer import weight_decayed
from megatron.errors import InputError


def rank_files(checkpoint: Checkpoint) -> FileSections:
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


def rank_places(checkpoint: Checkpoint, files: FileSections, pp_rank: int, tp_rank: int,
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


def bf16_placement(checkpoint: Checkpoint, files: FileSections, pp_rank: int, tp_rank: int,
                    layers: Dict[tuple, List[tuple]]) -> Dict[str, tuple]:
    """BF16_Optimizer's slices, as zero12.read takes them: each group's members flat in torch's order, unpadded
    (its mp_rank file records no param_shapes)."""
    placement = {}
    for group, members in enumerate(_rank_groups(checkpoint, files, pp_rank, tp_rank, layers)):
        offset = 0
        for name, shape in members:
            placement[name] = (group, offset, shape, 0, 1)
            offset += shape.numel()
    return placement


def read(_checkpoint: Checkpoint, files: FileSections, mp_rank: int, places: Dict[str, dict], kind: str,
                names: List[str]) -> Dict[str, torch.Tensor]:
    """`kind` (a moment, or a wrapper's master weights) of the parameters `names`; `places`: places'."""
    return files.read(mp_rank, {name: places[name][kind] for name in names})


def moe_read(_checkpoint: Checkpoint, files: FileSections, mp_rank: int, places: Dict[str, dict], kind: str,
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


def moe_places(checkpoint: Checkpoint, files: FileSections, tp_rank: int) -> Dict[str, dict]:
    """{name: {kind: (expert-parallel rank, tensor)}} of tensor-parallel rank `tp_rank`'s parameters that have
    Adam moments (experts.read_rank_state's, by name)."""
    state = experts.read_rank_state(checkpoint, files, tp_rank)
    return {name: {kind: by_name[name] for kind, by_name in state.items() if name in by_name}
            for name in state[MOMENTS[0]]}


def step_and_groups(files: FileSections) -> tuple:
    adam = mixed.adam_state(files.contents(0)["optimizer"])
    step = files.scalar(0, adam["state"][next(iter(adam["state"]))]["step"]) if adam["state"] else 0
    return int(step), adam["param_groups"]


def decay_groups(names_and_shapes: List[tuple]) -> List[str]:
    """Parameter names in torch's optimizer index order: the weight-decayed matrices, then the rest
    (training/optimizer.parameter_groups; the rule is config/flags/optimizer.weight_decayed)."""
    return ([name for name, shape in names_and_shapes if weight_decayed(shape)] +
            [name for name, shape in names_and_shapes if not weight_decayed(shape)])
