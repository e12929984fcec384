"""Training scalars under Megatron-DeepSpeed's TensorBoard tag names, so dashboards built on its runs keep working,
written to one or more writers (TensorBoard here; W&B in wandb_log.py) through one small interface.

Tags are upstream's (b4d4a0e), grouped as it groups them: each training scalar is written against the
iteration, and a " vs samples" / " vs tokens" twin against consumed samples / tokens, e.g.
"lm-loss-training/lm loss", "lm-loss-training/lm loss vs samples", "learning-rate/learning-rate",
"lm-loss-validation/lm loss validation ppl vs tokens". Upstream main's "throughput/" scalars go to the writers
that take them (W&B: main writes them to W&B only), so the TensorBoard files keep b4d4a0e's tags. Written by the
last rank only.
"""
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Protocol, Sequence


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


ITERATION, SAMPLES, TOKENS = "iteration", "samples", "tokens"  # the x-axes


class Point(NamedTuple):
    tag: str
    value: float
    axis: str  # ITERATION, SAMPLES or TOKENS
    x: int


class ScalarWriter(Protocol):
    """Where the points go. `write` gets the points of one event (an iteration, a validation run), all of one
    iteration; `flush`: make them visible to readers now (a validation result is rare and awaited); `close`
    flushes and ends. `writes_throughput`: whether it takes upstream main's throughput/ scalars."""

    writes_throughput: bool

    def write(self, points: Sequence[Point], flush: bool) -> None: ...

    def close(self) -> None: ...


class TensorBoardWriter:
    writes_throughput = False

    def __init__(self, log_dir: str, queue_size: int):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=log_dir, max_queue=queue_size)

    def write(self, points: Sequence[Point], flush: bool) -> None:
        for point in points:
            self.writer.add_scalar(point.tag, point.value, point.x)
        if flush:
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _with_twins(tag: str, value: float, iteration: int, samples: Optional[int] = None,
                tokens: Optional[int] = None) -> List[Point]:
    """The scalar against the iteration, and its " vs samples" / " vs tokens" twins where those are given."""
    points = [Point(tag, value, ITERATION, iteration)]
    if samples is not None:
        points.append(Point(tag + " vs samples", value, SAMPLES, samples))
    if tokens is not None:
        points.append(Point(tag + " vs tokens", value, TOKENS, tokens))
    return points


class ScalarLog:
    def __init__(self, writers: Sequence[ScalarWriter], options: TensorBoardOptions):
        self.writers = list(writers)
        self.options = options

    def _write(self, points: Sequence[Point], flush: bool = False, throughput: bool = False) -> None:
        for writer in self.writers:
            if writer.writes_throughput or not throughput:
                writer.write(points, flush)

    def due(self, iteration: int) -> bool:
        return iteration % self.options.log_interval == 0

    def training(self, iteration: int, samples: int, tokens: int, *, loss: float, learning_rate: float,
                 batch_size: int, loss_scale: float, grad_norm: Optional[float], num_zeros: Optional[float],
                 params_norm: Optional[float], curriculum_seqlen: Optional[int] = None) -> None:
        """One iteration's scalars (call when `due`); under a sequence-length curriculum its length, as b4d4a0e's
        "curriculum_seqlen"."""
        options = self.options
        points = [Point("steps-vs-samples/y=steps,x=samples", iteration, SAMPLES, samples),
                  Point("steps-vs-samples/y=samples,x=steps", samples, ITERATION, iteration),
                  Point("steps-vs-tokens/y=steps,x=tokens", iteration, TOKENS, tokens),
                  Point("steps-vs-tokens/y=tokens,x=steps", tokens, ITERATION, iteration)]
        if options.learning_rate:
            points += _with_twins("learning-rate/learning-rate", learning_rate, iteration, samples, tokens)
        if options.batch_size:
            points += _with_twins("batch-size/batch-size", batch_size, iteration, samples)
        points += _with_twins("lm-loss-training/lm loss", loss, iteration, samples, tokens)
        if options.loss_scale:
            points += _with_twins("loss-scale/loss-scale", loss_scale, iteration, samples, tokens)
        for tag, value in (("grad-norm/grad-norm", grad_norm), ("num-zeros/num-zeros", num_zeros),
                           ("params-norm/params-norm", params_norm)):
            if value is not None:
                points += _with_twins(tag, value, iteration, samples, tokens)
        if curriculum_seqlen is not None:
            points.append(Point("curriculum_seqlen", curriculum_seqlen, ITERATION, iteration))
        self._write(points)

    def throughput(self, iteration: int, samples_per_second: float, tflops: float, mfu: Optional[float]) -> None:
        """The log line's throughput figures (at --log-interval), under upstream main's names, to the writers that
        take them; MFU where the device's peak is known."""
        points = [Point("throughput/samples_per_sec", samples_per_second, ITERATION, iteration),
                  Point("throughput/tflops", tflops, ITERATION, iteration)]
        if mfu is not None:
            points.append(Point("throughput/mfu", mfu, ITERATION, iteration))
        self._write(points, throughput=True)

    def timers(self, iteration: int, samples: int, tokens: int, seconds: float, milliseconds: dict) -> None:
        """Iteration time, and the mean milliseconds per iteration of the --timing-log-level timers as
        "<name>-time"."""
        points = _with_twins("iteration-time/iteration-time", seconds, iteration, samples, tokens)
        points += [Point(f"{name}-time", value, ITERATION, iteration) for name, value in milliseconds.items()]
        self._write(points)

    def optimizer_states(self, iteration: int, tokens: int, statistics: dict) -> None:
        points = []
        for name, value in statistics.items():
            points += [Point(f"optimizer/{name} vs tokens", value, TOKENS, tokens),
                       Point(f"optimizer/{name}", value, ITERATION, iteration)]
        self._write(points)

    def memory(self, iteration: int, allocated_bytes: int) -> None:
        self._write([Point("mem-allocated-bytes", allocated_bytes, ITERATION, iteration)])

    def validation(self, iteration: int, samples: int, tokens: int, loss: float, ppl: float) -> None:
        points = _with_twins("lm-loss-validation/lm loss validation", loss, iteration, samples, tokens)
        if self.options.validation_ppl:
            points += _with_twins("lm-loss-validation/lm loss validation ppl", ppl, iteration, samples, tokens)
        self._write(points, flush=True)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
