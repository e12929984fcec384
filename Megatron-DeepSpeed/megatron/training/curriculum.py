"""The sequence-length curriculum during training, as upstream Megatron-DeepSpeed's loop drives it: DeepSpeed's
CurriculumScheduler asked before every iteration (global step = iteration + 1) for the length of that
iteration's training batches, which are cut to it; evaluation sees whole samples. Each iteration consumes its
global batch x that length in tokens (upstream's consumed_train_tokens), which the token-based learning-rate
schedule and --train-tokens count.

The scheduler's state is a function of the steps it was asked about, so a resumed run rebuilds it by asking again
for every iteration already trained (`replay`): the same answers, and the same consumed tokens, as the run that
saved the checkpoint had.
"""
import itertools
from typing import Any, Callable, Iterator, Mapping

from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler


class SequenceLengthCurriculum:
    """DeepSpeed's scheduler for the checked `curriculum_learning` section (config/curriculum.py)."""

    def __init__(self, section: Mapping[str, Any]):
        self.scheduler = CurriculumScheduler(dict(section))

    def length(self, iteration: int) -> int:
        """The sequence length of iteration `iteration` + 1's training batches (the scheduler's step then)."""
        return self.scheduler.update_difficulty(iteration + 1)

    def consumption(self, batch_size: Callable[[int], int]) -> Iterator[tuple[int, int]]:
        """Ask for each iteration from the first in turn, as a run trains them; yields the (samples, tokens) consumed
        after each. `batch_size(consumed_samples)` is the global batch size of the batch schedule."""
        samples = tokens = 0
        for iteration in itertools.count():
            size = batch_size(samples)
            samples, tokens = samples + size, tokens + size * self.length(iteration)
            yield samples, tokens

    def replay(self, iterations: int, batch_size: Callable[[int], int]) -> int:
        """Ask for the first `iterations` iterations again, as the run that trained them did; returns the tokens
        they consumed."""
        tokens = 0
        for _, tokens in itertools.islice(self.consumption(batch_size), iterations):
            pass
        return tokens

    def tokens_at(self, samples: float, batch_size: Callable[[int], int]) -> int:
        """The tokens consumed by the iteration that brings the consumed samples to `samples` (0 for none)."""
        if samples <= 0:
            return 0
        return next(tokens for consumed, tokens in self.consumption(batch_size) if consumed >= samples)
