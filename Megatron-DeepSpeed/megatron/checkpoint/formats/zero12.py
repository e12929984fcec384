"""DeepSpeed's ZeRO stages 1 and 2: per data-parallel rank, zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt
holds the rank's slice of each group's flat fp32 buffer (single_partition_of_fp32_groups, group padding stripped)
and of the Adam state (padded); the group's parameters, in flat order, are `param_shapes` in the mp_rank file, each
followed by its alignment padding (param_alignment_paddings). DeepSpeed's MoE groups are partitioned over the
ranks that hold the same experts instead. The weights are the engine's files' (pipeline_engine, plain_engine);
here the Adam state, as optimizer_state's DeepSpeed units read it."""
import os
from typing import Dict, List, Mapping

import torch

from megatron.checkpoint.file_names import model_parallel_rank, model_states_file, optimizer_states_file
from megatron.checkpoint.formats import expert_optimizer_state as experts
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.partitions import adam_tensors, flat_range
from megatron.checkpoint.tensor_records import FileSections
from megatron.checkpoint.torch_files import load_file


def _section(contents: Mapping) -> Dict[tuple, torch.Tensor]:
    """{(group, kind): flat tensor} of one data-parallel rank's partition (kind fp32, exp_avg, exp_avg_sq, step)."""
    partition = contents["optimizer_state_dict"]
    tensors = {(group, "fp32"): flat for group, flat in enumerate(partition["single_partition_of_fp32_groups"])}
    return {**tensors, **adam_tensors(partition["base_optimizer_state"]["state"])}


def partition_files(checkpoint: Checkpoint) -> FileSections:
    layout, bf16 = checkpoint.layout, checkpoint.flags.bf16
    return FileSections({(mp_rank, dp): os.path.join(checkpoint.directory, optimizer_states_file(mp_rank, dp, bf16))
                         for mp_rank in range(layout.tensor * layout.pipeline) for dp in range(layout.data)},
                        _section)


def rank_placement(checkpoint: Checkpoint, files: FileSections, pp_rank: int, tp_rank: int) -> Dict[str, tuple]:
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


def read(checkpoint: Checkpoint, files: FileSections, mp_rank: int, placement: Dict[str, tuple], kind: str,
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


def step_and_groups(files: FileSections) -> tuple:
    adam = files.contents((0, 0))["optimizer_state_dict"]["base_optimizer_state"]
    return int(files.scalar((0, 0), adam["state"][0]["step"])), adam["param_groups"]
