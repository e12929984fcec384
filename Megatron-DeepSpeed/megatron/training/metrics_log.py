"""What the training loop reports: Megatron's iteration and validation lines, the optional timer line, and
the scalars under upstream's TensorBoard tags (megatron/training/tensorboard_log.py) to TensorBoard and W&B
(megatron/training/wandb_log.py).

Only the last rank prints and writes; every figure that needs a collective (norms, zero counts, optimizer
statistics) is computed by the loop on all ranks and handed in.
"""
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

from megatron import device
from megatron.config.job import JobConfig, LoggingConfig
from megatron.model.gpt import GPTConfig, recomputes_every_layer
from megatron.training.flops import (LayerMatrices, flops_per_iteration, model_flops_utilization, peak_tflops,
                                     tflops_per_device)
from megatron.training.log_lines import iteration_line, memory_line, perplexity, timers_line, validation_lines
from megatron.training.moe_losses import MoEFigures
from megatron.training.tensorboard_log import ScalarLog, TensorBoardOptions, TensorBoardWriter
from megatron.training.wandb_log import start_wandb

_log = logging.getLogger(__name__)


class StepTimers:
    """--timing-log-level 1/2: wall time of named phases (train-step, evaluate, save-checkpoint), measured
    between device synchronisations. DeepSpeed's engines run forward, backward and the optimizer step
    internally; its own wall_clock_breakdown splits them further. Level 0 measures nothing."""

    PHASES = ("train-step", "evaluate", "save-checkpoint")  # the order of the timer line

    def __init__(self, level: int):
        self.level = level
        self.totals: dict = {}

    @contextlib.contextmanager
    def measure(self, name: str):
        if name not in self.PHASES:
            raise ValueError(f"unknown timed phase {name!r}; add it to StepTimers.PHASES")
        if not self.level:
            yield
            return
        device.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            device.synchronize()
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def take_means(self, iterations: int) -> dict:
        """Milliseconds per iteration of each phase since the last call."""
        means = {name: self.totals[name] * 1000.0 / iterations for name in self.PHASES if name in self.totals}
        self.totals = {}
        return means


@dataclass
class IterationFigures:
    """One iteration's figures, as the loop measured them."""
    loss: float
    learning_rate: float
    batch_size: int
    loss_scale: float
    grad_norm: float
    num_zeros: Optional[float] = None
    params_norm: Optional[float] = None
    optimizer_states: Optional[dict] = None
    moe: Optional[MoEFigures] = None  # an MoE model's
    consumed_tokens: Optional[int] = None  # after the iteration; None: consumed samples x --seq-length
    curriculum_seqlen: Optional[int] = None  # the iteration's length under a sequence-length curriculum


def tensorboard_options(logging_config: LoggingConfig) -> TensorBoardOptions:
    return TensorBoardOptions(
        log_interval=logging_config.tensorboard_log_interval, queue_size=logging_config.tensorboard_queue_size,
        learning_rate=logging_config.log_learning_rate_to_tensorboard,
        loss_scale=logging_config.log_loss_scale_to_tensorboard,
        batch_size=logging_config.log_batch_size_to_tensorboard, timers=logging_config.log_timers_to_tensorboard,
        validation_ppl=logging_config.log_validation_ppl_to_tensorboard,
        memory=logging_config.log_memory_to_tensorboard)


class MetricsLog:
    """Megatron's iteration lines (and TensorBoard / W&B scalars when asked) from the last rank."""

    def __init__(self, config: JobConfig, model: GPTConfig, train_iters: int, last_rank: bool, timers: StepTimers):
        self.config, self.model, self.train_iters, self.last_rank = config, model, train_iters, last_rank
        self.timers = timers
        self.tensorboard = self._scalar_log() if last_rank else None
        self.losses, self.samples, self.interval_start = [], 0, time.perf_counter()
        self.moe_figures = []
        self.memory_reported_at: Optional[int] = None  # Megatron's memory line: after the first logged iteration
        self.last_iteration = 0
        # Per iteration, as the batch may ramp up and a curriculum shortens the sequences (upstream counts its
        # length too). Logged TFLOPs count the recomputed forward as upstream's do; MFU counts the model's work only.
        # An MoE model's counts are of its active parameters (megatron/training/flops.py).
        self.hardware_flops = self.model_flops = 0.0  # since the last log line
        self.peak = peak_tflops(device.device_model_name(), config.precision.name)

    def _scalar_log(self) -> Optional[ScalarLog]:
        """The TensorBoard and W&B writers asked for; None when neither is."""
        logging_config = self.config.logging
        writers = []
        if logging_config.tensorboard_dir:
            writers.append(TensorBoardWriter(logging_config.tensorboard_dir, logging_config.tensorboard_queue_size))
        checkpoint, parallel = self.config.checkpoint, self.config.parallel
        layout = {"tensor": parallel.tensor, "pipeline": parallel.pipeline, "data": parallel.data,
                  "sequence": parallel.ds_sequence_parallel_size, "world_size": parallel.world_size,
                  "zero_stage": parallel.zero_stage}
        wandb = start_wandb(logging_config, checkpoint.load, checkpoint.save, {**self.config.flags, "layout": layout})
        if wandb is not None:
            writers.append(wandb)
        return ScalarLog(writers, tensorboard_options(logging_config)) if writers else None

    def _print(self, text: str) -> None:
        if self.last_rank:
            _log.info(text)

    def iteration(self, state, figures: IterationFigures) -> None:
        """After iteration `state.iteration` (state: training.TrainState, already advanced)."""
        config, tensorboard = self.config, self.tensorboard
        tokens = figures.consumed_tokens
        if tokens is None:
            tokens = state.consumed_train_samples * config.data.seq_length
        self.losses.append(figures.loss)
        if figures.moe is not None:
            self.moe_figures.append(figures.moe)
        self.last_iteration = state.iteration
        self.samples += figures.batch_size
        self._count_flops(figures.batch_size, figures.curriculum_seqlen or config.data.seq_length)
        if tensorboard is not None and tensorboard.due(state.iteration):
            tensorboard.training(state.iteration, state.consumed_train_samples, tokens, loss=figures.loss,
                                 learning_rate=figures.learning_rate, batch_size=figures.batch_size,
                                 loss_scale=figures.loss_scale, grad_norm=figures.grad_norm,
                                 num_zeros=figures.num_zeros, params_norm=figures.params_norm,
                                 curriculum_seqlen=figures.curriculum_seqlen)
            if figures.optimizer_states is not None:
                tensorboard.optimizer_states(state.iteration, tokens, figures.optimizer_states)
            if tensorboard.options.memory:
                tensorboard.memory(state.iteration, device.memory_stats()["allocated_bytes"])
        if state.iteration % config.logging.log_interval:
            return
        device.synchronize()
        iterations = len(self.losses)
        seconds = (time.perf_counter() - self.interval_start) / iterations
        world_size = config.parallel.world_size
        tflops = tflops_per_device(self.hardware_flops / iterations, seconds, world_size)
        mfu = model_flops_utilization(tflops_per_device(self.model_flops / iterations, seconds, world_size),
                                      self.peak)
        self._print(iteration_line(
            state.iteration, self.train_iters, state.consumed_train_samples, seconds * 1000.0,
            figures.learning_rate, figures.batch_size, sum(self.losses) / iterations, figures.loss_scale,
            figures.grad_norm, state.skipped_iterations, state.nan_iterations, self.samples / (seconds * iterations),
            tflops, mfu, num_zeros=figures.num_zeros, params_norm=figures.params_norm,
            curriculum_seqlen=figures.curriculum_seqlen, **self._take_moe_means()))
        if self.memory_reported_at is None:
            self._report_memory(state.iteration)
        timer_means = self.timers.take_means(iterations)
        if timer_means:
            self._print(timers_line(timer_means))
        if tensorboard is not None:
            tensorboard.throughput(state.iteration, self.samples / (seconds * iterations), tflops, mfu)
            if tensorboard.options.timers:
                tensorboard.timers(state.iteration, state.consumed_train_samples, tokens, seconds, timer_means)
        state.skipped_iterations = state.nan_iterations = 0
        self.losses, self.samples, self.interval_start = [], 0, time.perf_counter()
        self.hardware_flops = self.model_flops = 0.0

    def _count_flops(self, batch_size: int, seq_length: int) -> None:
        model = self.model
        shape = (batch_size, seq_length, model.num_layers, model.hidden_size, model.vocab_size)
        layer = LayerMatrices.of(model)
        self.hardware_flops += flops_per_iteration(*shape, recompute=recomputes_every_layer(model), moe=model.moe,
                                                   layer=layer)
        self.model_flops += flops_per_iteration(*shape, recompute=False, moe=model.moe, layer=layer)

    def _take_moe_means(self) -> dict:
        """The interval's mean MoE loss and its dropped assignments, for the line; none for a dense model."""
        moe, self.moe_figures = self.moe_figures, []
        if not moe:
            return {}
        return {"moe_loss": sum(figures.moe_loss for figures in moe) / len(moe),
                "dropped_tokens": sum(figures.dropped_tokens for figures in moe)}

    def validation(self, state, loss: float) -> None:
        self._print(validation_lines(state.iteration, loss))
        if self.tensorboard is not None:
            self.tensorboard.validation(state.iteration, state.consumed_train_samples, state.consumed_train_tokens,
                                        loss, perplexity(loss))

    def exclude_from_timing(self, seconds: float) -> None:
        """Evaluation and checkpointing inside a log interval do not count as iteration time."""
        self.interval_start += seconds

    def _report_memory(self, iteration: int) -> None:
        self._print(memory_line(dist.get_rank(), iteration, device.memory_stats()))
        self.memory_reported_at = iteration

    def close(self) -> None:
        """After the last iteration: the memory line again, its peak now the whole run's (the first one's comes
        before steady state)."""
        if self.memory_reported_at not in (None, self.last_iteration):
            self._report_memory(self.last_iteration)
        if self.tensorboard is not None:
            self.tensorboard.close()
