"""A mixture-of-experts model's Adam state as DeepSpeed's ZeRO stage 1-2 optimizer saves it, for one target
data-parallel size: a converted checkpoint then resumes at ZeRO 1 or 2 (this project's default is bf16 at
ZeRO 1) with its moments, at that size only.

What DeepSpeed 0.19.8 writes and reads (runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer; checked against
the files of an EP 2 x DP 4 bf16 ZeRO-1 run of this trainer):
  [bf16_]zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt = {'optimizer_state_dict': state_dict(), 'ds_version'}
        per rank `dp` of the dense data-parallel group (engine.py _get_zero_ckpt_name); the 'bf16_' prefix when
        the run trains in bf16, and the loader tries its own prefix, then the other (_get_all_zero_checkpoints).
  Groups: an MoE run at ZeRO 1-2 always has DeepSpeed's MoE groups (the dense decayed and undecayed groups,
        then the experts', expert_optimizer_state.rank_groups). __init__ flattens each group's parameters in
        group order (no padding between them unless zero_optimization.parameter_alignment), pads the flat
        buffer with zeros to a multiple of 2 (nccl_start_alignment_factor) x the group's partition count, and
        cuts it into that many equal partitions. A dense group is partitioned over the data-parallel group
        (rank dp holds partition dp); an expert group over the ranks holding the same experts
        (_configure_moe_settings: expert_dp_process_group), which with DeepSpeed's consecutive expert-parallel
        groups are ranks e, e + EP, ...: rank dp holds the experts of expert-parallel rank dp % EP and
        partition dp // EP of their group.
  state_dict() (elastic_checkpoint off, DeepSpeed's default): 'base_optimizer_state' = torch's state_dict of the
        inner AdamW, one flat parameter per group, its moments the whole padded partition;
        'single_partition_of_fp32_groups' = the fp32 master partitions, padding cut off ('group_paddings' says
        how much: only a group's last partitions hold any); 'param_alignment_paddings' (zeros), 'partition_count',
        'ds_version'; also 'loss_scaler', 'dynamic_loss_scale', 'overflow', 'clip_grad', 'zero_stage' and
        'param_slice_mappings', which the converter leaves out: _load_global_state keeps the run's own for
        the first four, and _load_legacy_checkpoint reads none of the others.
  Loading (engine.py _load_zero_checkpoint, then _load_legacy_checkpoint): refused unless the run's
        data-parallel size is the mp_rank file's 'dp_world_size'; each rank hands torch its own file's
        'base_optimizer_state' and copies its master partition from 'single_partition_of_fp32_groups'
        (zero_load_from_fp32_weights, on by default). The ZeRO stage is not checked: stage 1 and 2 read the
        same files. The precision neither: fp16's loss scale is not carried (its run starts from its flags').
"""
import importlib.metadata
import math
from typing import Callable, List, Mapping

import torch

from megatron.checkpoint.formats.expert_optimizer_state import rank_groups
from megatron.checkpoint.file_names import MOMENTS
from megatron.checkpoint.shards import shard_of

ALIGNMENT = 2  # DeepSpeedZeroOptimizer's nccl_start_alignment_factor


def partition(names: List[str], tensor: Callable[[str], torch.Tensor], numel: Mapping[str, int], index: int,
              count: int) -> tuple:
    """(partition `index` of `count` of the group of `names`, flattened and zero-padded as DeepSpeed pads it;
    how many padding elements it ends with). Only the parameters overlapping the partition are read."""
    total = sum(numel[name] for name in names)
    size = math.ceil(total / (ALIGNMENT * count)) * ALIGNMENT
    start, end = index * size, (index + 1) * size
    pieces, offset = [], 0
    for name in names:
        low, high = max(start, offset), min(end, offset + numel[name])
        if low < high:
            pieces.append(tensor(name).reshape(-1)[low - offset:high - offset].float())
        offset += numel[name]
    padding = size - sum(piece.numel() for piece in pieces)
    return torch.cat(pieces + [torch.zeros(padding)]), padding


def rank_partitions(model: Mapping[str, torch.Tensor], optimizer, data_parallel_rank: int, data_parallel_size: int,
                    expert_parallel_size: int, tp_rank: int, tp_size: int, split_experts: bool = False,
                    swiglu: bool = False) -> dict:
    """The contents of data-parallel rank `data_parallel_rank`'s ZeRO file of tensor-parallel rank `tp_rank`,
    from `optimizer` (an optimizer_state.OptimizerState of the full model; `swiglu`: SwiGLU MLPs)."""
    groups = rank_groups(model, optimizer.param_groups, True, data_parallel_rank % expert_parallel_size,
                         expert_parallel_size)
    step = torch.tensor(float(optimizer.step))
    state, torch_groups, masters, paddings, counts = {}, [], [], [], []
    for number, (hyper, members) in enumerate(groups):
        count, index = ((data_parallel_size // expert_parallel_size, data_parallel_rank // expert_parallel_size)
                        if hyper.get("moe") else (data_parallel_size, data_parallel_rank))
        numel = {name: shard_of(name, torch.empty(model[name].shape, device="meta"), tp_rank, tp_size,
                                split_experts, swiglu).numel() for name in members}

        def cut(kind: str) -> tuple:
            return partition(members, lambda name: shard_of(name, optimizer.tensors(kind)[name], tp_rank, tp_size,
                                                            split_experts, swiglu), numel, index, count)
        master, padding = cut("fp32")
        state[number] = {"step": step.clone(), **{kind: cut(kind)[0] for kind in MOMENTS}}
        torch_groups.append({**hyper, "params": [number]})
        masters.append(master[:master.numel() - padding].clone())
        paddings.append(padding)
        counts.append(count)
    version = importlib.metadata.version("deepspeed")
    return {"optimizer_state_dict": {"base_optimizer_state": {"state": state, "param_groups": torch_groups},
                                     "single_partition_of_fp32_groups": masters, "group_paddings": paddings,
                                     "param_alignment_paddings": [[0] * len(members) for _, members in groups],
                                     "partition_count": counts, "ds_version": version},
            "ds_version": version}
