"""PendingSteps: iterations' figures kept as tensors and read to the host together, in order."""
import pytest
import torch

from megatron.training.metrics_log import IterationFigures
from megatron.training.pending_steps import PendingSteps, StepRecord, due, read_to_host


def test_read_to_host_keeps_the_order_of_tensors_and_numbers():
    assert read_to_host([torch.tensor(1.5), 2, torch.tensor([3.0]), 4.25]) == [1.5, 2.0, 3.0, 4.25]
    assert read_to_host([1, 2]) == [1.0, 2.0] and read_to_host([]) == []


def record(iteration, loss, grad_norm, skipped, num_zeros=None):
    figures = IterationFigures(loss=loss, learning_rate=0.1, batch_size=4, loss_scale=1.0, grad_norm=grad_norm,
                               num_zeros=num_zeros)
    return StepRecord(iteration, 4 * iteration, figures, skipped)


def test_taken_records_are_numbers_in_order_and_the_list_empties():
    pending = PendingSteps()
    pending.add(record(1, torch.tensor(2.5), torch.tensor(0.5), [0, torch.tensor(0.0)]))
    pending.add(record(2, torch.tensor(float("nan")), 0.75, [1, torch.tensor(1.0)], num_zeros=torch.tensor(3.0)))
    first, second = pending.take()
    assert (first.iteration, first.consumed_samples, first.skipped) == (1, 4, 0)
    assert (first.figures.loss, first.figures.grad_norm, first.figures.num_zeros) == (2.5, 0.5, None)
    assert second.skipped == 2 and second.figures.num_zeros == 3.0 and second.figures.grad_norm == 0.75
    assert second.figures.loss != second.figures.loss  # NaN survives the read
    assert pending.take() == []


@pytest.mark.parametrize("iteration, tensorboard_interval, expected", [
    (10, None, True), (7, None, False), (7, 7, True), (7, 1, True), (8, 3, False)])
def test_figures_are_due_at_log_lines_and_tensorboard_points(iteration, tensorboard_interval, expected):
    assert due(iteration, 5, tensorboard_interval) is expected
