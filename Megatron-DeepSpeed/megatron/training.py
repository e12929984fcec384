"""The training loop: build everything from the flags, train on the DeepSpeed engine, evaluate, log, save.

DeepSpeed owns the optimizer step, gradient accumulation, clipping, loss scaling, ZeRO and the pipeline
schedule (its pipeline engine trains a PipelineModule, its plain engine anything else); this loop owns what
Megatron users expect around it: the learning-rate schedule counted in samples, the data order counted in
consumed samples (so a resumed run sees exactly the samples an uninterrupted one would), and Megatron's log
lines.
"""
import functools
import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable, Optional

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.engine import PipelineEngine

from megatron import device
from megatron.arguments import parse_args, validate_args
from megatron.checkpointing import load_checkpoint, save_checkpoint
from megatron.data.data_loaders import build_data_loader, build_datasets, train_valid_test_num_samples
from megatron.data.gpt_batch import make_batch
from megatron.ds_config import STEPS_PER_PRINT_NEVER, resolve_deepspeed_config
from megatron.learning_rates import learning_rate, schedule_samples
from megatron.errors import InputError
from megatron.model.pipe import pipeline_micro_batch
from megatron.optimizer import build_optimizer
from megatron.parallel_state import ParallelState
from megatron.tensor_parallel import tensor_parallel_rng_tracker
from megatron.tokenizer import build_tokenizer, vocab_size_with_padding
from megatron.training_log import iteration_line, perplexity, tflops_per_device, validation_lines


@dataclass
class TrainState:
    iteration: int = 0
    consumed_train_samples: int = 0
    skipped_iterations: int = 0  # since the last log line
    nan_iterations: int = 0  # since the last log line


def initialize_distributed(backend: str) -> None:
    """Join the process group set up by torchrun / the deepspeed launcher; a plain `python pretrain_gpt.py`
    becomes a group of one."""
    if "RANK" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free_port = probe.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", str(free_port)))
    deepspeed.init_distributed(dist_backend=backend, verbose=False)


def is_last_rank() -> bool:
    return dist.get_rank() == dist.get_world_size() - 1


def print_last_rank(message: str) -> None:
    if is_last_rank():
        print(message, flush=True)


def data_parallel_mean(value: torch.Tensor, parallel: ParallelState) -> float:
    """Mean of a scalar over the data-parallel ranks (every replica holds a loss of different samples)."""
    value = value.detach().float().clone()
    dist.all_reduce(value, group=parallel.get_data_parallel_group())
    return value.item() / parallel.get_data_parallel_world_size()


class Batches:
    """Endless micro-batches of a data loader, as model inputs on this process's device."""

    def __init__(self, loader, args, eod: int, restart: bool = False):
        self.loader, self.args, self.eod, self.restart = loader, args, eod, restart
        self.iterator = iter(loader)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        try:
            text = next(self.iterator)
        except StopIteration:
            if not self.restart:
                raise
            self.iterator = iter(self.loader)
            text = next(self.iterator)
        batch = make_batch(text, self.eod, reset_position_ids=self.args.reset_position_ids,
                           reset_attention_mask=self.args.reset_attention_mask, eod_mask_loss=self.args.eod_mask_loss)
        target = device.current_device()
        return {name: None if tensor is None else tensor.to(target) for name, tensor in batch.items()}


class Fp32GradientClipping:
    """Gradient clipping for DeepSpeed's plain fp32 path (ZeRO 0, no fp16/bf16), run as a step pre-hook of the
    optimizer, after gradients are reduced over data-parallel ranks (and tied pipeline stages).

    DeepSpeed clips that path itself but keeps no norm to report, and under pipeline parallelism its norm
    counts replicated parameters from the first stage only, so later stages' parameters are left out. Here
    every parameter counts once per model replica: tensor-parallel shards on every rank, replicated parameters
    on tensor-parallel rank 0, a tied pipeline weight on the stage that owns it. DeepSpeed's own clipping is
    then switched off (gradient_clipping 0 in its config)."""

    def __init__(self, model: torch.nn.Module, parallel: ParallelState, max_norm: float):
        self.model, self.parallel, self.max_norm = model, parallel, max_norm
        self.norm: Optional[float] = None  # of the last step, before clipping

    def _counted_here(self, parameter) -> bool:
        if getattr(parameter, "ds_pipe_replicated", False):
            return False
        return self.parallel.tp_rank == 0 or getattr(parameter, "tensor_model_parallel", False)

    def __call__(self, optimizer, args, kwargs) -> None:
        gradients = [p.grad for p in self.model.parameters() if p.grad is not None]
        squares = torch.zeros((), dtype=torch.float32, device=device.current_device())
        for parameter in self.model.parameters():
            if parameter.grad is not None and self._counted_here(parameter):
                squares += parameter.grad.detach().float().pow(2).sum()
        dist.all_reduce(squares, group=self.parallel.get_model_parallel_group())
        norm = squares.sqrt()
        self.norm = norm.item()
        if self.max_norm > 0:
            scale = torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)
            for gradient in gradients:
                gradient.mul_(scale.to(gradient.dtype))


def train_step(engine, batches: Batches, args, parallel: ParallelState) -> float:
    """One optimizer step over `num_micro_batches` micro-batches; returns the loss averaged over them and over
    the data-parallel ranks."""
    if isinstance(engine, PipelineEngine):  # train_batch does the averaging itself
        return engine.train_batch(map(pipeline_micro_batch, batches)).item()
    total = torch.zeros((), device=device.current_device())
    for _ in range(args.num_micro_batches):
        batch = next(batches)
        loss = engine(batch["tokens"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"],
                      labels=batch["labels"], loss_mask=batch["loss_mask"])
        engine.backward(loss)
        engine.step()  # DeepSpeed steps the optimizer only at the gradient-accumulation boundary
        total += loss.detach().float()
    return data_parallel_mean(total / args.num_micro_batches, parallel)


def evaluate(engine, batches: Batches, args, parallel: ParallelState) -> float:
    """Mean validation loss over `eval_iters` global batches."""
    if isinstance(engine, PipelineEngine):  # eval_batch averages over micro-batches and data-parallel ranks
        losses = [engine.eval_batch(map(pipeline_micro_batch, batches)).item() for _ in range(args.eval_iters)]
        return sum(losses) / args.eval_iters
    engine.eval()
    total = torch.zeros((), device=device.current_device())
    with torch.no_grad():
        for _ in range(args.eval_iters * args.num_micro_batches):
            batch = next(batches)
            total += engine(batch["tokens"], position_ids=batch["position_ids"],
                            attention_mask=batch["attention_mask"], labels=batch["labels"],
                            loss_mask=batch["loss_mask"]).float()
    engine.train()
    return data_parallel_mean(total / (args.eval_iters * args.num_micro_batches), parallel)


def learning_rate_schedule(args) -> Callable[[int], float]:
    """Megatron's schedule as a function of consumed samples: stateless, so a resumed run continues it."""
    warmup_samples, decay_samples = schedule_samples(args)
    return functools.partial(learning_rate, max_lr=args.lr, min_lr=args.min_lr, warmup_samples=warmup_samples,
                             decay_samples=decay_samples, decay_style=args.lr_decay_style)


def set_learning_rate(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


class MetricsLog:
    """Megatron's iteration lines (and TensorBoard scalars when asked) from the last rank."""

    def __init__(self, args, vocab_size: int, train_iters: int):
        self.args, self.vocab_size, self.train_iters = args, vocab_size, train_iters
        self.writer = None
        if args.tensorboard_dir and is_last_rank():
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir=args.tensorboard_dir)
        self.losses, self.interval_start = [], time.perf_counter()

    def iteration(self, state: TrainState, loss: float, grad_norm: float, lr: float, engine) -> None:
        self.losses.append(loss)
        args = self.args
        if state.iteration % args.log_interval:
            return
        device.synchronize()
        seconds = (time.perf_counter() - self.interval_start) / len(self.losses)
        mean_loss = sum(self.losses) / len(self.losses)
        loss_scale = float(getattr(engine.optimizer, "cur_scale", 1.0))
        samples_per_second = args.global_batch_size / seconds
        tflops = tflops_per_device(args.global_batch_size, args.seq_length, args.num_layers, args.hidden_size,
                                   self.vocab_size, seconds, args.world_size, args.checkpoint_activations)
        print_last_rank(iteration_line(
            state.iteration, self.train_iters, state.consumed_train_samples, seconds * 1000.0, lr,
            args.global_batch_size, mean_loss, loss_scale, grad_norm, state.skipped_iterations,
            state.nan_iterations, samples_per_second, tflops))
        if self.writer is not None:
            for name, value in (("lm loss", mean_loss), ("learning-rate", lr), ("grad-norm", grad_norm),
                                ("loss-scale", loss_scale), ("samples-per-second", samples_per_second)):
                self.writer.add_scalar(name, value, state.iteration)
        state.skipped_iterations = state.nan_iterations = 0
        self.losses, self.interval_start = [], time.perf_counter()

    def validation(self, iteration: int, loss: float) -> None:
        print_last_rank(validation_lines(iteration, loss))
        if self.writer is not None:
            self.writer.add_scalar("validation loss", loss, iteration)
            self.writer.add_scalar("validation ppl", perplexity(loss), iteration)
            self.writer.flush()

    def exclude_from_timing(self, seconds: float) -> None:
        """Evaluation and checkpointing inside a log interval do not count as iteration time."""
        self.interval_start += seconds


@dataclass
class TrainingResult:
    iteration: int
    losses: list  # the training loss of every iteration this run made
    grad_norms: list  # and its gradient norm, before clipping
    validation_loss: Optional[float]
    model: torch.nn.Module  # this rank's module as trained: its pipeline stage, or the plain model; TP-sharded
    parallel: ParallelState


def engine_config(args, pipelined: bool, clipping_ourselves: bool) -> dict:
    """The DeepSpeed config of the flags (ds_config), adjusted for this loop: no DeepSpeed clipping where
    Fp32GradientClipping does it; on the pipeline engine, DeepSpeed's samples/sec line every --log-interval
    (unless the user's JSON says otherwise) and stage outputs sent whole (see model/pipe.py's GPTPipe)."""
    config = resolve_deepspeed_config(args)
    if clipping_ourselves:
        config["gradient_clipping"] = 0.0
    if pipelined:
        pipeline = dict(config.get("pipeline") or {})
        for key in ("pipe_partitioned", "grad_partitioned"):
            if pipeline.get(key):
                raise InputError(f"--deepspeed_config {args.deepspeed_config} sets pipeline.{key}=true, but stage "
                                 "outputs may be sequence-parallel chunks or change shape between batches, which "
                                 "that partitioning cannot handle; set it to false or remove it")
            pipeline[key] = False
        config["pipeline"] = pipeline
        if config["steps_per_print"] == STEPS_PER_PRINT_NEVER:
            config["steps_per_print"] = args.log_interval
    return config


@dataclass
class Trainer:
    """Everything the loop needs, built from the flags."""
    args: object
    engine: object
    parallel: ParallelState
    rng_tracker: object
    tokenizer: object
    clipping: Optional[Fp32GradientClipping]


def build_trainer(model_provider: Callable, argv) -> Trainer:
    """Flags, process groups, seeds, tokenizer, model and the DeepSpeed engine. `model_provider(args,
    padded_vocab_size, parallel, rng_tracker)` returns this rank's part of the model, parallelised: a DeepSpeed
    PipelineModule (trained on the pipeline engine) or a plain nn.Module (on DeepSpeed's plain engine)."""
    args = parse_args(argv)
    initialize_distributed(args.distributed_backend or device.communication_backend())
    validate_args(args, dist.get_world_size(), device.device_name())
    parallel = ParallelState(args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    device.manual_seed(args.seed)  # the default stream (dropout): identical on every rank
    rng_tracker = tensor_parallel_rng_tracker(args.seed, parallel.tp_rank)

    tokenizer = build_tokenizer(args.tokenizer_type, vocab_file=args.vocab_file, merge_file=args.merge_file,
                                tokenizer_model=args.tokenizer_model, vocab_size=args.vocab_size)
    args.padded_vocab_size = vocab_size_with_padding(tokenizer.vocab_size, args.make_vocab_size_divisible_by,
                                                     args.tensor_model_parallel_size)

    model = model_provider(args, args.padded_vocab_size, parallel, rng_tracker)
    pipelined = isinstance(model, PipelineModule)
    optimizer = build_optimizer(model, args)
    clipping = None
    if args.zero_stage == 0 and not (args.fp16 or args.bf16):
        clipping = Fp32GradientClipping(model, parallel, args.clip_grad)
        optimizer.register_step_pre_hook(clipping)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=None if pipelined else parallel,
                                           config=engine_config(args, pipelined, clipping is not None),
                                           dist_init_required=False)
    return Trainer(args, engine, parallel, rng_tracker, tokenizer, clipping)


def build_batches(trainer: Trainer, state: TrainState) -> tuple[Batches, Optional[Batches]]:
    """Training batches from `state`'s consumed samples on; validation batches (cycled) where they continue
    after as many evaluations as the resumed run had made."""
    args, parallel, eod = trainer.args, trainer.parallel, trainer.tokenizer.eod
    dp_rank, dp_size = parallel.dp_rank, parallel.get_data_parallel_world_size()
    train_set, valid_set, _ = build_datasets(args, args.padded_vocab_size)
    train = Batches(build_data_loader(train_set, state.consumed_train_samples, args, dp_rank, dp_size), args, eod)
    if valid_set is None or not args.eval_iters:
        return train, None
    consumed_valid = (state.iteration // args.eval_interval) * args.eval_iters * args.global_batch_size
    valid_loader = build_data_loader(valid_set, consumed_valid % len(valid_set), args, dp_rank, dp_size)
    return train, Batches(valid_loader, args, eod, restart=True)


def pretrain(model_provider: Callable, argv=None) -> TrainingResult:
    """Train a GPT as the flags say (see build_trainer for `model_provider`)."""
    trainer = build_trainer(model_provider, argv)
    args, engine, parallel, clipping = trainer.args, trainer.engine, trainer.parallel, trainer.clipping
    state = TrainState()
    with torch.no_grad():  # the pipeline engine re-synchronises tied weights in place while loading
        state.iteration, state.consumed_train_samples = load_checkpoint(engine, args, trainer.rng_tracker)
    train, valid = build_batches(trainer, state)
    schedule = learning_rate_schedule(args)
    train_iters = args.train_iters or train_valid_test_num_samples(args)[0] // args.global_batch_size
    metrics = MetricsLog(args, args.padded_vocab_size, train_iters)
    validation_loss, losses, grad_norms = None, [], []
    skipped_before = engine.skipped_steps
    while state.iteration < train_iters:
        set_learning_rate(engine.optimizer, schedule(state.consumed_train_samples))
        loss = train_step(engine, train, args, parallel)
        grad_norm = clipping.norm if clipping else float(engine.get_global_grad_norm() or 0.0)
        losses.append(loss)
        grad_norms.append(grad_norm)
        state.iteration += 1
        state.consumed_train_samples += args.global_batch_size
        state.skipped_iterations += engine.skipped_steps - skipped_before
        skipped_before = engine.skipped_steps
        state.nan_iterations += int(not math.isfinite(loss))
        metrics.iteration(state, loss, grad_norm, schedule(state.consumed_train_samples), engine)

        paused = time.perf_counter()
        if valid is not None and state.iteration % args.eval_interval == 0:
            validation_loss = evaluate(engine, valid, args, parallel)
            metrics.validation(state.iteration, validation_loss)
        exiting = bool(args.exit_interval) and state.iteration % args.exit_interval == 0
        if args.save and (state.iteration % args.save_interval == 0 or exiting):
            save_checkpoint(engine, args, state.iteration, state.consumed_train_samples, trainer.rng_tracker)
        metrics.exclude_from_timing(time.perf_counter() - paused)
        if exiting:
            print_last_rank(f"exiting program at iteration {state.iteration}")
            break
    else:
        if args.save and state.iteration % args.save_interval:
            save_checkpoint(engine, args, state.iteration, state.consumed_train_samples, trainer.rng_tracker)
        if valid is not None and state.iteration % args.eval_interval:
            validation_loss = evaluate(engine, valid, args, parallel)
            metrics.validation(state.iteration, validation_loss)
    return TrainingResult(state.iteration, losses, grad_norms, validation_loss, engine.module, parallel)
