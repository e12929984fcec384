"""BF16_Optimizer's Adam state, which DeepSpeed 0.19.8 steps on the pipeline engine in bf16 at ZeRO stage 0
(mixed_precision_state.py), cut for one data-parallel size: what a converted checkpoint resumes from there.

What DeepSpeed writes and reads (runtime/bf16_optimizer.py; checked against the files of a PP 2 x DP 2 bf16
ZeRO-0 run of this trainer):
  bf16_zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt = {'optimizer_state_dict': state_dict(), 'ds_version'}
        per data-parallel rank (engine.py _save_zero_checkpoint; its 'ds_config' is not read back).
  _setup_for_real_optimizer: each of torch's groups flattened in order (no padding between members), the flat
        buffer zero-padded to a multiple of 2 (nccl_start_alignment_factor) x DP and cut into DP equal slices,
        the rule of ZeRO 1-2's partitions (expert_zero_partitions.partition).
  state_dict(): 'base_optimizer_state' = torch's AdamW state_dict of the slices (one flat parameter per group,
        its step the iterations taken, its moments zero in the padding); 'single_partition_of_fp32_groups' = the
        fp32 slices with their padding (ZeRO 1-2 cut it off); 'group_paddings' (the padding, recorded on the last
        rank only), 'partition_count', 'ds_version'. 'clip_grad' (the loader keeps the run's own without it) and
        'param_slice_mappings' (not read back) are left out.
  Loading: load_state_dict -> _load_legacy_checkpoint(state_dict_list) takes entry [data-parallel rank], its
        moments, and with load_from_fp32_weights its master slices. At ZeRO 0 the engine reads none of these files:
        engine.py _load_checkpoint hands the optimizer the mp_rank file's 'optimizer' (one rank's state_dict, which
        _load_legacy_checkpoint indexes by the rank: a KeyError, so DeepSpeed does not resume its own bf16 ZeRO-0
        pipeline checkpoints) without load_from_fp32_weights (the master weights would stay the initial ones).
        So the trainer loads this rank's file itself (checkpoint/trainer/load.py), for its own checkpoints too.
"""
import importlib.metadata
from typing import Callable, List, Mapping

import torch

from megatron.checkpoint.reshape.expert_zero_partitions import partition
from megatron.checkpoint.file_names import MOMENTS


def rank_slices(groups: List[tuple], tensor: Callable[[str, str], torch.Tensor], numel: Mapping[str, int],
                step: int, data_parallel_rank: int, data_parallel_size: int) -> dict:
    """The contents of data-parallel rank `data_parallel_rank`'s file of one model-parallel rank: `groups` are its
    optimizer groups as (hyperparameters, member names in torch's order), tensor(kind, name) its shard of one
    kind (fp32, exp_avg, exp_avg_sq), `numel` each member's size."""
    state, torch_groups, masters, paddings = {}, [], [], []
    for number, (hyper, members) in enumerate(groups):
        def cut(kind: str) -> tuple:
            return partition(members, lambda name: tensor(kind, name), numel, data_parallel_rank, data_parallel_size)
        master, _ = cut("fp32")
        padding = master.numel() * data_parallel_size - sum(numel[name] for name in members)
        state[number] = {"step": torch.tensor(float(step)), **{kind: cut(kind)[0] for kind in MOMENTS}}
        torch_groups.append({**hyper, "params": [number]})
        masters.append(master)
        paddings.append(padding if data_parallel_rank == data_parallel_size - 1 else 0)
    version = importlib.metadata.version("deepspeed")
    return {"optimizer_state_dict": {"base_optimizer_state": {"state": state, "param_groups": torch_groups},
                                     "single_partition_of_fp32_groups": masters, "group_paddings": paddings,
                                     "partition_count": [data_parallel_size] * len(groups), "ds_version": version},
            "ds_version": version}
