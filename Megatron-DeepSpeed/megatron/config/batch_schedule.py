"""The global batch size of every iteration: constant, or Megatron's --rampup-batch-size ramp.

Upstream's ramp (RampupBatchsizeNumMicroBatches): the batch grows from START by INCREMENT in equal intervals
of consumed samples until RAMP_SAMPLES are consumed, then stays at --global-batch-size. It is a function of
the consumed samples alone, so the data order (the sampler streams micro-batches from the consumed-sample
count), the learning-rate schedule (also counted in samples) and a resumed run all agree with it.
"""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class BatchSchedule:
    global_batch_size: int  # the final (or only) size
    micro_batch_times_data_parallel: int  # samples per micro-batch step over all data-parallel ranks
    rampup: Optional[tuple] = None  # (start, increment, ramp_samples), as megatron.config.flags.training validates it

    def batch_size(self, consumed_samples: int) -> int:
        """Global batch size of the iteration that starts after `consumed_samples`."""
        if self.rampup is None:
            return self.global_batch_size
        start, increment, ramp_samples = self.rampup
        if consumed_samples > ramp_samples:
            return self.global_batch_size
        increments = (self.global_batch_size - start) // increment
        if increments == 0 or ramp_samples == 0:  # nothing to ramp (upstream divides by zero here)
            return start
        samples_per_increment = ramp_samples / increments
        return start + int(consumed_samples / samples_per_increment) * increment

    def micro_batches(self, consumed_samples: int) -> int:
        """Micro-batches per data-parallel rank (gradient accumulation steps) of that iteration."""
        return self.batch_size(consumed_samples) // self.micro_batch_times_data_parallel

    def iterations(self, train_samples: int) -> int:
        """Iterations that --train-samples makes: the ramp's, then whole full batches (a partial last batch is
        dropped, as upstream)."""
        consumed = iterations = 0
        if self.rampup is not None:
            while consumed <= self.rampup[2]:
                consumed += self.batch_size(consumed)
                iterations += 1
        return iterations + (train_samples - consumed) // self.global_batch_size

