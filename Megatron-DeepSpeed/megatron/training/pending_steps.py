"""Iterations whose figures are still on the device, read to the host together once per log interval.

Reading a tensor's value makes the host wait until the device has finished everything queued before it, so
one read per step (the loss, the gradient norm, a skipped-step counter) keeps the host from running ahead
and costs a collective besides. The loop records each iteration's figures as they come (tensors or numbers)
and takes them all at a log iteration, before a checkpoint, and when training ends: one all-reduce for the
data-parallel mean of the losses and one copy to the host for everything.
"""
import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from megatron.training.metrics_log import IterationFigures


@dataclass
class StepRecord:
    iteration: int  # after the step
    consumed_samples: int  # after the step
    figures: IterationFigures  # loss, grad_norm and num_zeros may still be tensors
    skipped: list  # the skipped-step counters after the step (numbers or tensors), to be summed
    loss_averaged: bool = False  # already over the data-parallel ranks (an MoE model's, read per step)


@dataclass
class SettledStep:
    iteration: int
    consumed_samples: int
    figures: IterationFigures  # every figure a number
    skipped: int  # skipped steps since the start of the run


def read_to_host(values: list) -> list:
    """Each value as a float; the tensors among them copied to the host in one transfer."""
    tensors = [value.detach().float().reshape(()) for value in values if isinstance(value, torch.Tensor)]
    read = iter(torch.stack(tensors).tolist() if tensors else ())
    return [next(read) if isinstance(value, torch.Tensor) else float(value) for value in values]


class PendingSteps:
    """Records of the iterations since the last take. With a `data_parallel_group`, each record's loss is this
    rank's and is averaged over that group when taken (the pipeline engine averages its losses itself, and
    is given none)."""

    def __init__(self, data_parallel_group=None, data_parallel_size: int = 1):
        self.group = data_parallel_group if data_parallel_size > 1 else None
        self.size = data_parallel_size
        self.records: list = []

    def add(self, record: StepRecord) -> None:
        self.records.append(record)

    def take(self) -> list:
        """The records so far as SettledSteps, in order; the list is emptied."""
        records, self.records = self.records, []
        if not records:
            return []
        losses = [record.figures.loss for record in records]
        averaging = [index for index, record in enumerate(records) if not record.loss_averaged]
        if self.group is not None and averaging:
            summed = torch.stack([torch.as_tensor(losses[index]).detach().float() for index in averaging])
            dist.all_reduce(summed, group=self.group)
            for index, loss in zip(averaging, summed):
                losses[index] = loss
        fields = [(record.figures.grad_norm, record.figures.num_zeros or 0.0, *record.skipped) for record in records]
        values = iter(read_to_host([*losses, *(value for row in fields for value in row)]))
        loss_values = [next(values) / (1 if record.loss_averaged else self.size) for record in records]
        settled = []
        for record, loss, row in zip(records, loss_values, fields):
            grad_norm, num_zeros, *skipped = (next(values) for _ in row)
            figures = dataclasses.replace(record.figures, loss=loss, grad_norm=grad_norm,
                                          num_zeros=None if record.figures.num_zeros is None else num_zeros)
            settled.append(SettledStep(record.iteration, record.consumed_samples, figures, round(sum(skipped))))
        return settled


def due(iteration: int, log_interval: int, tensorboard_interval: Optional[int]) -> bool:
    """Whether the figures must be read after `iteration` for the log (a line, or a TensorBoard point)."""
    return iteration % log_interval == 0 or bool(tensorboard_interval) and iteration % tensorboard_interval == 0
