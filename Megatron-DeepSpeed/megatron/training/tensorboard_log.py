"""TensorBoard scalars under Megatron-DeepSpeed's tag names, so dashboards built on its runs keep working.

Tags are upstream's (b4d4a0e), grouped as it groups them: each training scalar is written against the
iteration, and a " vs samples" / " vs tokens" twin against consumed samples / tokens, e.g.
"lm-loss-training/lm loss", "lm-loss-training/lm loss vs samples", "learning-rate/learning-rate",
"lm-loss-validation/lm loss validation ppl vs tokens". Written by the last rank only.
"""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class TensorBoardOptions:
    """Which optional scalars to write (upstream's --log-*-to-tensorboard flags)."""
    log_interval: int = 1  # --tensorboard-log-interval
    queue_size: int = 1000  # --tensorboard-queue-size
    learning_rate: bool = True
    loss_scale: bool = True
    batch_size: bool = False
    timers: bool = False
    validation_ppl: bool = False
    memory: bool = False


class TensorBoardLog:
    def __init__(self, log_dir: str, options: TensorBoardOptions):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=log_dir, max_queue=options.queue_size)
        self.options = options

    def _write(self, tag: str, value: float, iteration: int, samples: Optional[int] = None,
               tokens: Optional[int] = None) -> None:
        self.writer.add_scalar(tag, value, iteration)
        if samples is not None:
            self.writer.add_scalar(tag + " vs samples", value, samples)
        if tokens is not None:
            self.writer.add_scalar(tag + " vs tokens", value, tokens)

    def due(self, iteration: int) -> bool:
        return iteration % self.options.log_interval == 0

    def training(self, iteration: int, samples: int, tokens: int, *, loss: float, learning_rate: float,
                 batch_size: int, loss_scale: float, grad_norm: Optional[float], num_zeros: Optional[float],
                 params_norm: Optional[float], curriculum_seqlen: Optional[int] = None) -> None:
        """One iteration's scalars (call when `due`); under a sequence-length curriculum its length, as b4d4a0e's
        "curriculum_seqlen"."""
        options = self.options
        self.writer.add_scalar("steps-vs-samples/y=steps,x=samples", iteration, samples)
        self.writer.add_scalar("steps-vs-samples/y=samples,x=steps", samples, iteration)
        self.writer.add_scalar("steps-vs-tokens/y=steps,x=tokens", iteration, tokens)
        self.writer.add_scalar("steps-vs-tokens/y=tokens,x=steps", tokens, iteration)
        if options.learning_rate:
            self._write("learning-rate/learning-rate", learning_rate, iteration, samples, tokens)
        if options.batch_size:
            self._write("batch-size/batch-size", batch_size, iteration, samples)
        self._write("lm-loss-training/lm loss", loss, iteration, samples, tokens)
        if options.loss_scale:
            self._write("loss-scale/loss-scale", loss_scale, iteration, samples, tokens)
        for tag, value in (("grad-norm/grad-norm", grad_norm), ("num-zeros/num-zeros", num_zeros),
                           ("params-norm/params-norm", params_norm)):
            if value is not None:
                self._write(tag, value, iteration, samples, tokens)
        if curriculum_seqlen is not None:
            self.writer.add_scalar("curriculum_seqlen", curriculum_seqlen, iteration)

    def timers(self, iteration: int, milliseconds: dict) -> None:
        """Mean milliseconds per iteration of the --timing-log-level timers, as "<name>-time"."""
        for name, value in milliseconds.items():
            self.writer.add_scalar(f"{name}-time", value, iteration)

    def iteration_time(self, iteration: int, samples: int, tokens: int, seconds: float) -> None:
        self._write("iteration-time/iteration-time", seconds, iteration, samples, tokens)

    def optimizer_states(self, iteration: int, tokens: int, statistics: dict) -> None:
        for name, value in statistics.items():
            self.writer.add_scalar(f"optimizer/{name} vs tokens", value, tokens)
            self.writer.add_scalar(f"optimizer/{name}", value, iteration)

    def memory(self, iteration: int, allocated_bytes: int) -> None:
        self.writer.add_scalar("mem-allocated-bytes", allocated_bytes, iteration)

    def validation(self, iteration: int, samples: int, tokens: int, loss: float, ppl: float) -> None:
        self._write("lm-loss-validation/lm loss validation", loss, iteration, samples, tokens)
        if self.options.validation_ppl:
            self._write("lm-loss-validation/lm loss validation ppl", ppl, iteration, samples, tokens)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
