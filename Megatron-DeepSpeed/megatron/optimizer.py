"""The AdamW optimizer with Megatron's parameter groups."""
from torch import nn

from megatron.model import kernels


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weight matrices only: biases and LayerNorm parameters (every parameter with one
    dimension) are not decayed, as in Megatron."""
    decayed, not_decayed = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (not_decayed if parameter.dim() == 1 else decayed).append(parameter)
    return [{"params": decayed, "weight_decay": weight_decay},
            {"params": not_decayed, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, args):
    """AdamW over `model`, with the kernel of the device that will hold its state: the CPU's with
    --cpu-optimizer (ZeRO moves the state there, where an accelerator's fused kernel cannot step it), else
    this process's device. Its learning rate is set before every step by the loop."""
    adam = kernels.adam_optimizer_cls("cpu" if args.cpu_optimizer else None)
    return adam(parameter_groups(model, args.weight_decay), lr=args.lr,
                betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps, weight_decay=args.weight_decay)
