"""Which sample indices each data-parallel rank reads, step by step (Megatron's pretraining
sampler).

The stream is a pure function of consumed_samples: a run resumed from a checkpoint that recorded
k samples continues with exactly the micro-batches an uninterrupted run would have read next.
"""
import operator

import torch

from megatron.errors import InputError


def _whole_number(name, value, least):
    try:
        number = operator.index(value)
    except TypeError:
        raise InputError(f"sampler {name} must be an integer, got {value!r}") from None
    if number < least:
        raise InputError(f"sampler {name} is {number} but must be at least {least}")
    return number


class MegatronPretrainingSampler:
    """Yields lists of sample indices, one micro-batch of this rank per step.

    Each step takes micro_batch_size * data_parallel_size consecutive indices starting at
    consumed_samples; rank r reads [r * micro_batch_size, (r + 1) * micro_batch_size) of them.
    With drop_last=False an incomplete final step is cut the same way, so later ranks may get a
    short or empty list (every rank still takes the same number of steps)."""

    def __init__(self, total_samples, consumed_samples, micro_batch_size, data_parallel_rank,
                 data_parallel_size, drop_last=True):
        self.total_samples = _whole_number("total_samples (dataset length)", total_samples, 1)
        self.consumed_samples = _whole_number("consumed_samples", consumed_samples, 0)
        self.micro_batch_size = _whole_number("micro_batch_size (--micro-batch-size)",
                                              micro_batch_size, 1)
        self.data_parallel_size = _whole_number("data_parallel_size", data_parallel_size, 1)
        self.data_parallel_rank = _whole_number("data_parallel_rank", data_parallel_rank, 0)
        if self.data_parallel_rank >= self.data_parallel_size:
            raise InputError(f"sampler data_parallel_rank {self.data_parallel_rank} must be below "
                             f"data_parallel_size {self.data_parallel_size}")
        if self.consumed_samples >= self.total_samples:
            raise InputError(f"consumed_samples {self.consumed_samples} leaves nothing to read "
                             f"from a dataset of {self.total_samples} samples; resume from an "
                             f"earlier checkpoint or ask for more samples (--train-iters / "
                             f"--train-samples)")
        self.drop_last = drop_last
        self.step_size = self.micro_batch_size * self.data_parallel_size

    def _full_steps_end(self):
        remaining = self.total_samples - self.consumed_samples
        return self.consumed_samples + remaining // self.step_size * self.step_size

    def __len__(self):
        """Micro-batches this rank yields."""
        full_steps = (self._full_steps_end() - self.consumed_samples) // self.step_size
        has_tail = not self.drop_last and self._full_steps_end() < self.total_samples
        return full_steps + int(has_tail)

    def __iter__(self):
        own_start = self.data_parallel_rank * self.micro_batch_size
        full_end = self._full_steps_end()
        for step_start in range(self.consumed_samples, full_end, self.step_size):
            first = step_start + own_start
            yield list(range(first, first + self.micro_batch_size))
        if not self.drop_last and full_end < self.total_samples:
            tail = range(full_end, self.total_samples)
            yield list(tail[own_start:own_start + self.micro_batch_size])


class MegatronPretrainingRandomSampler:
    """--dataloader-type cyclic: Megatron's random sampler. Each data-parallel rank owns a fixed contiguous
    bucket of the samples (its share of the whole micro-batch steps) and reads it in a fresh random order
    every epoch, seeded by the epoch number; the loop over epochs is endless when the loader is re-iterated.
    Like the pretraining sampler, the stream is a pure function of consumed_samples (which it advances as it
    yields), so a resumed run continues where the saved one stopped."""

    def __init__(self, total_samples, consumed_samples, micro_batch_size, data_parallel_rank,
                 data_parallel_size):
        self.total_samples = _whole_number("total_samples (dataset length)", total_samples, 1)
        self.consumed_samples = _whole_number("consumed_samples", consumed_samples, 0)
        self.micro_batch_size = _whole_number("micro_batch_size (--micro-batch-size)", micro_batch_size, 1)
        self.data_parallel_size = _whole_number("data_parallel_size", data_parallel_size, 1)
        self.data_parallel_rank = _whole_number("data_parallel_rank", data_parallel_rank, 0)
        if self.data_parallel_rank >= self.data_parallel_size:
            raise InputError(f"sampler data_parallel_rank {self.data_parallel_rank} must be below "
                             f"data_parallel_size {self.data_parallel_size}")
        self.step_size = self.micro_batch_size * self.data_parallel_size
        self.samples_per_epoch = self.total_samples - self.total_samples % self.step_size
        if self.samples_per_epoch == 0:
            raise InputError(f"the dataset has {self.total_samples} samples, fewer than one micro-batch step "
                             f"(--micro-batch-size {self.micro_batch_size} x data parallel size "
                             f"{self.data_parallel_size}); ask for more samples or lower the batch")

    def __len__(self):
        """Micro-batches this rank yields in one pass from the current position to the end of its epoch."""
        return (self.samples_per_epoch - self.consumed_samples % self.samples_per_epoch) // self.step_size

    def __iter__(self):
        epoch, position = divmod(self.consumed_samples, self.samples_per_epoch)
        if position % self.step_size:
            raise InputError(f"consumed_samples {self.consumed_samples} is not a whole number of micro-batch "
                             f"steps of {self.step_size} samples; resume with the batch sizes it was saved with")
        bucket_size = self.samples_per_epoch // self.data_parallel_size
        bucket_start = self.data_parallel_rank * bucket_size
        generator = torch.Generator()
        generator.manual_seed(epoch)
        order = torch.randperm(bucket_size, generator=generator).tolist()
        own = order[position // self.data_parallel_size:]
        for first in range(0, len(own) - self.micro_batch_size + 1, self.micro_batch_size):
            self.consumed_samples += self.step_size
            yield [bucket_start + index for index in own[first:first + self.micro_batch_size]]
