"""The figures an MoE model gathers while it trains or evaluates (megatron/model/moe.py's MoEGPTModel), reduced
over the data-parallel ranks for the log: the LM loss apart from the MoE loss, as upstream logs them, and the
expert assignments the gates dropped for want of capacity (ours)."""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from megatron.model.moe import MoEGPTModel


@dataclass(frozen=True)
class MoEFigures:
    lm_loss: float  # mean over the micro-batches and the data-parallel ranks
    moe_loss: float  # likewise: --moe-loss-coeff x the summed load-balancing losses
    dropped_tokens: int  # expert assignments dropped, summed over the micro-batches and data-parallel ranks


def take_moe_figures(module: torch.nn.Module, parallel) -> Optional[MoEFigures]:
    """The figures since the last call, or None for a dense model (a collective over the data-parallel group).
    Tensor-parallel ranks hold the same tokens, so only the data-parallel group is summed."""
    if not isinstance(module, MoEGPTModel):
        return None
    lm_sum, moe_sum, dropped, forwards = module.take_loss_sums()
    values = torch.stack([lm_sum.float() / forwards, moe_sum.float() / forwards, dropped.float()])
    dist.all_reduce(values, group=parallel.get_data_parallel_group())
    size = parallel.get_data_parallel_world_size()
    return MoEFigures(lm_loss=values[0].item() / size, moe_loss=values[1].item() / size,
                      dropped_tokens=round(values[2].item()))
