"""Gradients of sequence-parallel parameters, summed over the tensor-parallel group once per optimizer step.

Under sequence parallelism some parameters are replicated on every tensor-parallel rank but applied to this
rank's chunk of the sequence only (LayerNorms, row-parallel biases): each rank's gradient covers its own tokens,
and the full gradient is their sum over the group. The sum is linear, so it need not follow every backward pass:
the micro-batches of a step accumulate locally and one flattened all-reduce per step sums them all.

It must run after the step's last backward pass and before DeepSpeed reads the gradients at the accumulation
boundary (its data-parallel reduction, clipping and the optimizer step). Both of DeepSpeed's engines run that
reduction after autograd returns from the last micro-batch, and neither offers a hook in between, so the sum is
triggered from autograd itself: when every sequence-parallel parameter has accumulated the gradient of its
`micro_batches_per_step`-th backward pass. This needs DeepSpeed to leave gradients on the parameters until the
boundary, which ZeRO stages 0 and 1 do (megatron.config.arguments refuses the combinations that do not).
"""
from typing import Iterable, List

import torch
import torch.distributed as dist
from torch import nn


def mark_sequence_parallel(parameter: nn.Parameter) -> None:
    """Mark a parameter replicated across tensor-parallel ranks that sees only this rank's sequence chunk."""
    parameter.sequence_parallel = True


def sequence_parallel_parameters(module: nn.Module) -> List[nn.Parameter]:
    return [parameter for parameter in module.parameters() if getattr(parameter, "sequence_parallel", False)]


def all_reduce_gradients(parameters: Iterable[nn.Parameter], group) -> None:
    """Sum the parameters' gradients over `group` in place, with one all-reduce per dtype."""
    by_dtype = {}
    for parameter in parameters:
        if parameter.grad is None:
            raise RuntimeError(f"a sequence-parallel parameter of shape {tuple(parameter.shape)} has no gradient "
                               "to sum over the tensor-parallel group: something consumed it before the end of "
                               "the step (e.g. ZeRO stage 2 or 3, or DeepSpeed's overlap_comm)")
        by_dtype.setdefault(parameter.grad.dtype, []).append(parameter.grad)
    for gradients in by_dtype.values():
        flat = torch.cat([gradient.reshape(-1) for gradient in gradients])
        dist.all_reduce(flat, group=group)
        for gradient, summed in zip(gradients, flat.split([gradient.numel() for gradient in gradients])):
            gradient.copy_(summed.view_as(gradient))


class SequenceParallelGradientSum:
    """Sums the sequence-parallel gradients of a module over `group` after every `micro_batches_per_step`
    backward passes (see the module docstring). Each backward pass must reach every such parameter once."""

    def __init__(self, module: nn.Module, group, micro_batches_per_step: int):
        if micro_batches_per_step < 1:
            raise ValueError(f"micro_batches_per_step must be at least 1, not {micro_batches_per_step}")
        self.parameters = sequence_parallel_parameters(module)
        self.group, self.micro_batches_per_step = group, micro_batches_per_step
        self.micro_batches_done = 0
        self._waiting = {id(parameter) for parameter in self.parameters}  # still to accumulate in this pass
        if dist.get_world_size(group) > 1:
            for parameter in self.parameters:
                parameter.register_post_accumulate_grad_hook(self._accumulated)

    def _accumulated(self, parameter: nn.Parameter) -> None:
        if id(parameter) not in self._waiting:
            raise RuntimeError(f"a sequence-parallel parameter of shape {tuple(parameter.shape)} accumulated a "
                               "second gradient before the others had one: every backward pass must reach all "
                               "sequence-parallel parameters of the module once")
        self._waiting.remove(id(parameter))
        if self._waiting:
            return
        self._waiting = {id(parameter) for parameter in self.parameters}
        self.micro_batches_done += 1
        if self.micro_batches_done == self.micro_batches_per_step:
            self.micro_batches_done = 0
            all_reduce_gradients(self.parameters, self.group)


def sum_sequence_parallel_gradients_each_step(module: nn.Module, group,
                                              micro_batches_per_step: int) -> SequenceParallelGradientSum:
    """From now on, sum the sequence-parallel gradients of `module` over `group` at the end of every
    `micro_batches_per_step`-th backward pass (the end of each optimizer step's gradient accumulation)."""
    return SequenceParallelGradientSum(module, group, micro_batches_per_step)
