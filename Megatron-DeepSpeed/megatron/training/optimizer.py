"""The optimizer of --optimizer (AdamW or SGD) with Megatron's parameter groups."""
import torch
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from torch import nn

from megatron.config.flags.optimizer import weight_decayed
from megatron.config.job import OptimizerConfig
from megatron.model.kernels import Kernels, select_kernels


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Megatron's two groups, decayed and not (config/flags/optimizer.weight_decayed). The names let DeepSpeed
    split off the experts' groups."""
    decayed, not_decayed = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (decayed if weight_decayed(parameter.shape) else not_decayed).append(parameter)
    return [{"name": "decayed", "params": decayed, "weight_decay": weight_decay},
            {"name": "not_decayed", "params": not_decayed, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, config: OptimizerConfig, device_kernels: Kernels,
                    moe_param_groups: bool = False):
    """--optimizer over `model`: AdamW (Megatron's "adam", decoupled weight decay) with the kernel of the
    device that will hold its state: the CPU's with --cpu-optimizer (ZeRO moves the state there, where an
    accelerator's fused kernel cannot step it), else the run's device kernel; or torch's SGD with
    --sgd-momentum and L2 weight decay, as upstream. The learning rate is set before every step by the loop.
    moe_param_groups (--create-moe-param-group): experts in groups of their own, DeepSpeed's split, which ZeRO
    needs to partition them over their expert-data-parallel ranks."""
    groups = parameter_groups(model, config.weight_decay)
    if moe_param_groups:
        groups = split_params_into_different_moe_groups_for_optimizer(groups)
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.sgd_momentum, weight_decay=config.weight_decay)
    adam = select_kernels("cpu").adam if config.cpu_optimizer else device_kernels.adam
    return adam(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
                weight_decay=config.weight_decay)
