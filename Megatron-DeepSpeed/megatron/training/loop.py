"""The training loop: build everything from the flags, train on the DeepSpeed engine, evaluate, log, save.

DeepSpeed owns the optimizer step, gradient accumulation, clipping, loss scaling, ZeRO and the pipeline
schedule (its pipeline engine trains a PipelineModule, its plain engine anything else); this loop owns what
Megatron users expect around it: the learning-rate schedule counted in samples, the data order counted in
consumed samples (so a resumed run sees exactly the samples an uninterrupted one would), and Megatron's log
lines.
"""
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Callable, Optional

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.engine import PipelineEngine
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

from megatron import device
from megatron.files import save_dir_lock as save_lock
from megatron.checkpoint.trainer.guard import check_checkpoint_directories
from megatron.checkpoint.trainer.resume_plan import ResumePlan, resolve_schedule
from megatron.checkpoint.trainer.load import load_checkpoint, load_options, padded_vocab_size, plan_load
from megatron.checkpoint.trainer.save import save_checkpoint
from megatron.config.arguments import job_config, parse_args, validate_args, with_flags
from megatron.config.ds_config import STEPS_PER_PRINT_NEVER, resolve_deepspeed_config
from megatron.config.job import CheckpointConfig, JobConfig, ScheduleConfig
from megatron.config.learning_rates import learning_rate
from megatron.data.data_loaders import PretrainingData, build_data_loader
from megatron.data.gpt_batch import model_inputs, truncated_batch
from megatron.errors import InputError
from megatron.model.gpt import GPTConfig, recomputed_checkpoints
from megatron.model.gpt_config import gpt_config
from megatron.model.kernels import Kernels, select_kernels
from megatron.model.moe import MoEGPTModel, active_parameter_count
from megatron.model.pipe import pipeline_micro_batch
from megatron.parallel_state import ParallelState, first_rank_checks, initialize_distributed
from megatron.tensor_parallel import sum_sequence_parallel_gradients_each_step, tensor_parallel_rng_tracker
from megatron.tensor_parallel.deepspeed_checkpointing import deepspeed_checkpointing_rng_tracker
from megatron.tokenizer import build_tokenizer
from megatron.training.divergence import DivergenceMonitor
from megatron.training.exit_requests import ExitRequests
from megatron.training.log_lines import (active_parameter_count_line, exit_line, final_evaluation_lines,
                                         parameter_count_line)
from megatron.training.clipping import Fp32GradientClipping
from megatron.training.curriculum import SequenceLengthCurriculum
from megatron.training.metrics import optimizer_state_statistics, parameters_norm, stepped_optimizer
from megatron.training.metrics_log import IterationFigures, MetricsLog, StepTimers
from megatron.training.moe_losses import MoEFigures, take_moe_figures
from megatron.training.nonfinite_step_guard import NonFiniteStepGuard, zero_step_norm
from megatron.training.optimizer import build_optimizer
from megatron.training.pending_steps import PendingSteps, StepRecord, due, read_to_host
from megatron.training.watchdog import Watchdog

_log = logging.getLogger(__name__)


@dataclass
class TrainState:
    iteration: int = 0
    consumed_train_samples: int = 0
    consumed_train_tokens: int = 0  # samples x their length: --seq-length, or the curriculum's at the time
    skipped_iterations: int = 0  # since the last log line
    nan_iterations: int = 0  # since the last log line


def is_last_rank() -> bool:
    return dist.get_rank() == dist.get_world_size() - 1


def log_last_rank(message: str) -> None:
    if is_last_rank():
        _log.info(message)


def data_parallel_mean(value: torch.Tensor, parallel: ParallelState) -> float:
    """Mean of a scalar over the data-parallel ranks (every replica holds a loss of different samples)."""
    value = value.detach().float().clone()
    dist.all_reduce(value, group=parallel.get_data_parallel_group())
    return value.item() / parallel.get_data_parallel_world_size()


class Batches:
    """Endless micro-batches of a data loader (model inputs, built by the loader: gpt_batch.BatchMaker), on this
    process's device."""

    def __init__(self, loader, restart: bool = False):
        self.loader, self.restart = loader, restart
        self.iterator = iter(loader)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        try:
            batch = next(self.iterator)
        except StopIteration:
            if not self.restart:
                raise
            self.iterator = iter(self.loader)
            batch = next(self.iterator)
        target = device.current_device()
        return {name: None if tensor is None else tensor.to(target, non_blocking=True)
                for name, tensor in batch.items()}

    def release(self) -> None:
        """Drop the loader: its worker processes end now (PyTorch stops them when the loader goes)."""
        self.loader = self.iterator = None


@contextlib.contextmanager
def releasing(*all_batches: Optional[Batches]):
    """Release the data loaders when their use ends, however it ends: their worker processes ignore SIGTERM
    (data_loaders.py), so they must end with their loader, not be left to multiprocessing's exit handler,
    which would send them SIGTERM and wait for them forever."""
    try:
        yield
    finally:
        for batches in all_batches:
            if batches is not None:
                batches.release()


def train_step(engine, batches: Batches, num_micro_batches: int, parallel: ParallelState,
               reduce_gradients: bool = True) -> tuple:
    """One optimizer step over `num_micro_batches` micro-batches (the engine's gradient accumulation steps);
    returns the LM loss averaged over them, and an MoE model's figures (None for a dense one). The dense loss is
    a tensor: on the pipeline engine also averaged over the data-parallel ranks, on the plain engine this
    rank's (PendingSteps averages it when the loop reads it); an MoE model's is read and averaged here, with its
    other figures. Without `reduce_gradients` (one data-parallel rank, ZeRO 0) DeepSpeed's gradient all-reduce,
    which would flatten, reduce over one rank and copy back every gradient, is skipped through its no_sync()."""
    if isinstance(engine, PipelineEngine):  # train_batch does the averaging itself
        return engine.train_batch(map(pipeline_micro_batch, batches)), None
    total = torch.zeros((), device=device.current_device())
    for index in range(num_micro_batches):
        # The boundary is set explicitly: DeepSpeed would count it from its running micro-step total, which a
        # --rampup-batch-size change of accumulation steps can leave out of step with the iteration.
        engine.set_gradient_accumulation_boundary(index == num_micro_batches - 1)
        batch = next(batches)
        loss = engine(batch["tokens"], **model_inputs(batch))
        with contextlib.nullcontext() if reduce_gradients else engine.no_sync():
            engine.backward(loss)
        engine.step()  # DeepSpeed steps the optimizer only at the gradient-accumulation boundary
        total += loss.detach().float()
    moe = take_moe_figures(engine.module, parallel)
    return (moe.lm_loss, moe) if moe else (total / num_micro_batches, None)


def evaluate(engine, batches: Batches, eval_iters: int, num_micro_batches: int, parallel: ParallelState,
             deepspeed_checkpointing: bool = False) -> float:
    """Mean validation loss over `eval_iters` global batches of `num_micro_batches` micro-batches (the full
    --global-batch-size, also while it ramps up)."""
    if isinstance(engine, PipelineEngine):  # eval_batch averages over micro-batches and data-parallel ranks
        losses = [engine.eval_batch(map(pipeline_micro_batch, batches), num_micro_batches=num_micro_batches).item()
                  for _ in range(eval_iters)]
        if deepspeed_checkpointing:  # the pipeline recomputes without grad too: drop what DeepSpeed kept
            deepspeed.checkpointing.reset()
        return sum(losses) / eval_iters
    engine.eval()
    total = torch.zeros((), device=device.current_device())
    with torch.no_grad():
        for _ in range(eval_iters * num_micro_batches):
            batch = next(batches)
            total += engine(batch["tokens"], **model_inputs(batch)).float()
    engine.train()
    moe = take_moe_figures(engine.module, parallel)  # the LM loss alone, as upstream evaluates
    return moe.lm_loss if moe else data_parallel_mean(total / (eval_iters * num_micro_batches), parallel)


def learning_rate_schedule(schedule: ScheduleConfig, warmup_end_tokens: Optional[int] = None) -> Callable:
    """Megatron's schedule as a function of consumed samples (and consumed tokens, by default samples x
    --seq-length): stateless, so a resumed run continues it. `warmup_end_tokens`: the tokens a sample warmup
    consumed, where that is not warmup samples x --seq-length (a sequence-length curriculum)."""
    if warmup_end_tokens is None:
        warmup_end_tokens = schedule.warmup_samples * schedule.tokens_per_sample
    if schedule.decay_tokens is not None and schedule.warmup_tokens is None and \
            warmup_end_tokens >= schedule.decay_tokens:
        raise InputError(f"--lr-decay-tokens {schedule.decay_tokens} ends before the warmup of "
                         f"{schedule.warmup_samples:g} samples ({warmup_end_tokens:g} tokens) does; lengthen the "
                         "decay or shorten the warmup")
    return functools.partial(learning_rate, max_lr=schedule.lr, min_lr=schedule.min_lr,
                             warmup_samples=schedule.warmup_samples, decay_samples=schedule.decay_samples,
                             decay_style=schedule.decay_style, tokens_per_sample=schedule.tokens_per_sample,
                             warmup_tokens=schedule.warmup_tokens, decay_tokens=schedule.decay_tokens,
                             warmup_end_tokens=warmup_end_tokens)


def set_learning_rate(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@dataclass
class TrainingResult:
    iteration: int
    losses: list  # the training loss of every iteration this run made
    grad_norms: list  # and its gradient norm, before clipping
    validation_loss: Optional[float]
    model: torch.nn.Module  # this rank's module as trained: its pipeline stage, or the plain model; TP-sharded
    parallel: ParallelState


def engine_config(config: JobConfig, pipelined: bool, clipping_ourselves: bool, universal_load: bool = False,
                  guarding_steps_ourselves: bool = False, rank_parameters: Optional[int] = None) -> dict:
    """The DeepSpeed config of the flags (ds_config), adjusted for this loop: no DeepSpeed clipping where
    Fp32GradientClipping does it; no per-tensor bf16 overflow check where NonFiniteStepGuard does it (from ZeRO's
    norm, which must then be computed); on the
    pipeline engine, DeepSpeed's samples/sec line every --log-interval (unless the user's JSON says otherwise)
    and stage outputs sent whole (see model/pipe.py's GPTPipe); the universal-checkpoint loader where --load
    holds a reshaped checkpoint (checkpoint/trainer/resume_plan.py). DeepSpeed's throughput timer is off unless the user's
    JSON configures it: it waits for the device at the start and end of every step, and its samples/sec
    figures, printed every steps_per_print, duplicate the iteration line. ZeRO's reduce bucket, unless the flags
    or JSON size it, holds at most the rank's `rank_parameters` (see capped_reduce_bucket)."""
    engine = resolve_deepspeed_config(config)
    zero = engine.setdefault("zero_optimization", {})
    if rank_parameters is not None and zero.get("stage", 0) >= 1:
        zero.setdefault("reduce_bucket_size", capped_reduce_bucket(rank_parameters))
    engine.setdefault("timers", {"throughput": {"enabled": False}})
    if clipping_ourselves:
        engine["gradient_clipping"] = 0.0
    if guarding_steps_ourselves:
        if zero.get("compute_grad_norm") is False:
            raise InputError(f"--deepspeed_config {config.deepspeed_config} sets zero_optimization."
                             "compute_grad_norm=false, but a bf16 ZeRO step is judged by that norm (non-finite "
                             "gradients skip it); remove the key")
        engine["bf16"] = {**engine.get("bf16", {}), "check_grad_overflow": False}
    if universal_load:
        engine["checkpoint"] = {**engine.get("checkpoint", {}), "load_universal": True}
    if pipelined:
        pipeline = dict(engine.get("pipeline") or {})
        for key in ("pipe_partitioned", "grad_partitioned"):
            if pipeline.get(key):
                raise InputError(f"--deepspeed_config {config.deepspeed_config} sets pipeline.{key}=true, but "
                                 "stage outputs may be sequence-parallel chunks or change shape between batches, "
                                 "which that partitioning cannot handle; set it to false or remove it")
            pipeline[key] = False
        engine["pipeline"] = pipeline
        if engine["steps_per_print"] == STEPS_PER_PRINT_NEVER:
            engine["steps_per_print"] = config.logging.log_interval
    return engine


def capped_reduce_bucket(rank_parameters: int) -> int:
    """DeepSpeed allocates its whole reduce bucket (5e8 elements by default: 0.93 GiB in bf16, twice on the pipeline
    engine) in every backward, whatever the model's size. A bucket of the rank's parameter count still reduces
    every gradient at once, as the default does for any smaller rank, without the rest."""
    return min(DeepSpeedZeroConfig().reduce_bucket_size, rank_parameters)


def evaluation_engine_config(config: JobConfig, pipelined: bool, universal_load: bool) -> dict:
    """engine_config for --skip-train: ZeRO 1-2 partition only optimizer state and gradients, of which evaluation
    has none, so it runs at stage 0 (DeepSpeed would otherwise build its partitioned fp32 copies without an
    optimizer); ZeRO-3 stays, since its weights are partitioned."""
    engine = engine_config(config, pipelined, clipping_ourselves=False, universal_load=universal_load)
    if engine["zero_optimization"].get("stage") in (1, 2):
        engine["zero_optimization"] = {**engine["zero_optimization"], "stage": 0}
    return engine


@dataclass(frozen=True)
class Trainer:
    """Everything the loop needs, built from the flags."""
    config: JobConfig
    model_config: GPTConfig  # the padded vocabulary and the kernels included
    engine: object
    parallel: ParallelState
    rng_tracker: object
    tokenizer: object
    clipping: Optional[Fp32GradientClipping]
    step_guard: Optional[NonFiniteStepGuard]
    resume: Optional[ResumePlan] = None  # what --load restores; None: a fresh run
    data: object = PretrainingData()  # datasets(config, tokenizer, vocab) and batch_maker(config, tokenizer, chunk)


def model_parallel_rng_tracker(config: JobConfig, parallel: ParallelState):
    """The tracker of the model-parallel random stream, which also provides activation recomputation:
    DeepSpeed's with --deepspeed-activation-checkpointing (configured from its flags), else ours."""
    if not config.activation_checkpointing.deepspeed:
        return tensor_parallel_rng_tracker(config.model.seed, parallel.tp_rank)
    chunks = recomputed_checkpoints(config.model)
    return deepspeed_checkpointing_rng_tracker(config.model.seed, parallel, chunks, config.activation_checkpointing)


def report_parameter_count(model: torch.nn.Module, parallel: ParallelState) -> None:
    """Each data-parallel rank 0 prints its model piece's size, as upstream does (an MoE model: with its local
    experts), and for an MoE model also the parameters a token uses."""
    if parallel.dp_rank == 0 and parallel.sp_rank == 0:  # sequence-parallel ranks hold the same piece
        count = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        _log.info(parameter_count_line(parallel.tp_rank, parallel.pp_rank, count))
        if isinstance(model, MoEGPTModel):
            _log.info(active_parameter_count_line(parallel.tp_rank, parallel.pp_rank, active_parameter_count(model)))


def start_up_checks(checkpoint: CheckpointConfig, optimizer: bool) -> None:
    """--load and --save checked before any rank reads a file, and --save held by this run for its life (one
    writer per directory); on rank 0 only (first_rank_checks)."""
    check_checkpoint_directories(checkpoint.load, checkpoint.save, checkpoint.trust_checkpoint, optimizer)
    if checkpoint.save:
        save_lock.hold(checkpoint.save)


def build_trainer(model_provider: Callable, argv, adaptor_kernels: Optional[object] = None,
                  data: object = PretrainingData()) -> Trainer:
    """Flags, process groups, seeds, tokenizer, model and the DeepSpeed engine. `model_provider(model_config,
    parallel_config, parallel, rng_tracker)` returns this rank's part of the model, parallelised: a DeepSpeed
    PipelineModule (trained on the pipeline engine) or a plain nn.Module (on DeepSpeed's plain engine).
    `adaptor_kernels` are a device adaptor's kernels (deepspeed_npu's), preferred over PyTorch's; `data` the
    run's datasets and batches (pre-training's, or data/sft_data.SupervisedData for fine-tuning)."""
    args = parse_args(argv)
    device.use_local_rank_flag(args.local_rank)
    initialize_distributed(args.distributed_backend or device.communication_backend(), args.distributed_timeout_minutes)
    config = job_config(validate_args(args, dist.get_world_size(), device.device_name()))
    if config.precision.bf16:
        device.refuse_bf16_if_unsupported()
    if config.precision.fp16:
        device.refuse_fp16_if_overflow_invisible()
    if config.model.torch_compile:
        device.refuse_compile_if_unavailable()
    loads_optimizer = not (config.checkpoint.finetune or config.checkpoint.no_load_optim or config.logging.skip_train)
    first_rank_checks(functools.partial(start_up_checks, config.checkpoint, loads_optimizer))  # before slow work
    resume = plan_load(config)
    if resume is not None:  # --use-checkpoint-lr-scheduler: the checkpoint's schedule flags; its ZeRO stage
        adopted = {**resolve_schedule(config.flags, resume, load_options(config)),
                   **resumed_zero_stage(config, resume)}
        if adopted:
            config = with_flags(config, adopted)
    if config.parallel.zero_stage_note and dist.get_rank() == 0:
        _log.info(config.parallel.zero_stage_note)
    parallel = ParallelState(config.parallel.tensor, config.parallel.pipeline,
                             timedelta(minutes=config.stopping.distributed_timeout_minutes),
                             config.parallel.ds_sequence_parallel_size)
    device.manual_seed(config.model.seed)  # the default stream (dropout): identical on every rank
    rng_tracker = model_parallel_rng_tracker(config, parallel)

    tokens = config.tokenizer
    tokenizer = build_tokenizer(tokens.tokenizer_type, vocab_file=tokens.vocab_file, merge_file=tokens.merge_file,
                                tokenizer_model=tokens.tokenizer_model, vocab_size=tokens.vocab_size)
    padded_vocab = padded_vocab_size(tokenizer.vocab_size, tokens.make_vocab_size_divisible_by,
                                     config.parallel.tensor, resume, config.checkpoint.load)
    kernels = select_kernels(device.device_name(), adaptor_kernels)
    if parallel.rank == 0:
        _log.info(f"kernels: {kernels.description()}")
        if config.flags.get("use_flash_attn"):
            _log.info(f"--use-flash-attn*: upstream's FlashAttention package is not used; attention runs on "
                      f"{kernels.attention_name()}, the device's fastest kernel")
    model_config = gpt_config(config.model, padded_vocab, kernels, moe=config.moe if config.moe.enabled else None)

    model = model_provider(model_config, config.parallel, parallel, rng_tracker)
    report_parameter_count(model, parallel)
    engine, clipping, step_guard = build_engine(model, config, kernels, parallel,
                                                universal_load=bool(resume and resume.universal))
    return Trainer(config, model_config, engine, parallel, rng_tracker, tokenizer, clipping, step_guard, resume, data)


def resumed_zero_stage(config: JobConfig, resume: ResumePlan) -> dict:
    """The flags that take the ZeRO stage at which the checkpoint's optimizer state loads, where the run chose
    none (plan_resume decides)."""
    if resume.zero_stage is None:
        return {}
    return {"zero_stage": resume.zero_stage,
            "zero_stage_note": f"ZeRO stage {resume.zero_stage}: the stage at which the optimizer state of --load "
                               f"{config.checkpoint.load} loads (--zero-stage chooses; --no-load-optim loads the "
                               f"weights at any stage)"}


def build_engine(model: torch.nn.Module, config: JobConfig, kernels: Kernels, parallel: ParallelState,
                 universal_load: bool = False) -> tuple[object, Optional[Fp32GradientClipping]]:
    """The DeepSpeed engine that trains `model` (this rank's part, from a model provider) with the job's
    optimizer, and our gradient clipping where DeepSpeed's is switched off."""
    if config.parallel.sequence_parallel:  # before DeepSpeed reduces the gradients at the end of each step
        sum_sequence_parallel_gradients_each_step(model, parallel.get_tensor_model_parallel_group(),
                                                  config.batch.num_micro_batches)
    pipelined = isinstance(model, PipelineModule)
    clipping = step_guard = None
    if config.logging.skip_train:  # evaluation only: no optimizer, no state of one (and none read, see load_options)
        engine, _, _, _ = deepspeed.initialize(model=model, mpu=None if pipelined else parallel,
                                               config=evaluation_engine_config(config, pipelined, universal_load),
                                               dist_init_required=False)
        return engine, clipping, step_guard
    optimizer = build_optimizer(model, config.optimizer, kernels,
                                moe_param_groups=config.moe.enabled and (config.moe.create_param_group or
                                                                         config.parallel.zero_stage > 0))
    if config.parallel.zero_stage == 0 and not (config.precision.fp16 or config.precision.bf16):
        clipping = Fp32GradientClipping(model, parallel, config.optimizer.clip_grad,
                                        count_zeros=config.logging.log_num_zeros_in_grad)
        optimizer.register_step_pre_hook(clipping)
    guarding = config.precision.bf16 and config.parallel.zero_stage in (1, 2) and not config.optimizer.cpu_optimizer
    rank_parameters = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=None if pipelined else parallel,
                                           config=engine_config(config, pipelined, clipping is not None,
                                                                universal_load, guarding, rank_parameters),
                                           dist_init_required=False)
    if guarding:  # judged by the norm ZeRO computes for its clipping, once it exists
        step_guard = NonFiniteStepGuard(zero_step_norm(engine))
        optimizer.register_step_pre_hook(step_guard)
    return engine, clipping, step_guard


def data_loader_factory(trainer: Trainer) -> Callable:
    """build_data_loader(dataset, consumed_samples) for this rank's micro-batches."""
    parallel, batch, data = trainer.parallel, trainer.config.batch, trainer.config.data
    batch_maker = trainer.data.batch_maker(trainer.config, trainer.tokenizer,
                                           (parallel.get_sequence_parallel_rank(),
                                            parallel.get_sequence_parallel_world_size()))
    return functools.partial(build_data_loader, micro_batch_size=batch.micro_batch_size,
                             num_workers=data.num_workers, data_parallel_rank=parallel.dp_rank,
                             data_parallel_size=parallel.get_data_parallel_world_size(),
                             dataloader_type=data.dataloader_type, collate_fn=batch_maker)


def build_batches(trainer: Trainer, state: TrainState) -> tuple[Batches, Optional[Batches]]:
    """Training batches from `state`'s consumed samples on; validation batches (cycled) where they continue
    after as many evaluations as the resumed run had made."""
    config = trainer.config
    data, logging_config, batch = config.data, config.logging, config.batch
    loader_of = data_loader_factory(trainer)
    train_set, valid_set, _ = trainer.data.datasets(config, trainer.tokenizer, trainer.model_config.vocab_size)
    train = Batches(loader_of(train_set, state.consumed_train_samples), restart=data.dataloader_type == "cyclic")
    if valid_set is None or not logging_config.eval_iters:
        return train, None
    consumed_valid = ((state.iteration // logging_config.eval_interval) * logging_config.eval_iters
                      * batch.global_batch_size)
    return train, Batches(loader_of(valid_set, consumed_valid % len(valid_set)), restart=True)


def evaluate_splits(trainer: Trainer, iteration: int, splits: tuple[str, ...]) -> dict:
    """Upstream's evaluation after training (with --skip-train, instead of it): --eval-iters global batches
    from the start of each of `splits` ("validation", "test") that has samples, each reported in upstream's
    end-of-run block. Returns the loss of each split evaluated."""
    config, engine = trainer.config, trainer.engine
    eval_iters, batch = config.logging.eval_iters, config.batch
    datasets = dict(zip(("train", "validation", "test"),
                        trainer.data.datasets(config, trainer.tokenizer, trainer.model_config.vocab_size)))
    loader_of = data_loader_factory(trainer)
    losses = {}
    for split in splits:
        if datasets[split] is None or not eval_iters:
            continue
        batches = Batches(loader_of(datasets[split], 0), restart=True)
        with releasing(batches):
            losses[split] = evaluate(engine, batches, eval_iters, batch.num_micro_batches, trainer.parallel,
                                     deepspeed_checkpointing=config.activation_checkpointing.deepspeed)
        log_last_rank(final_evaluation_lines(iteration, eval_iters * batch.global_batch_size, split, losses[split]))
    return losses


def evaluate_checkpoint(trainer: Trainer) -> TrainingResult:
    """--skip-train: the checkpoint in --load evaluated on the validation and test splits."""
    load_dir = trainer.config.checkpoint.load
    if trainer.resume is None:
        raise InputError(f"--skip-train: --load {load_dir} holds no checkpoint to evaluate; give the --save "
                         "directory of a training run")
    with torch.no_grad():  # the pipeline engine re-synchronises tied weights in place while loading
        iteration, _ = load_checkpoint(trainer.engine, load_dir, trainer.rng_tracker, trainer.resume,
                                       trainer.parallel)
    log_last_rank("skipping training (--skip-train is on) ...")
    losses = evaluate_splits(trainer, iteration, ("validation", "test"))
    return TrainingResult(iteration, [], [], losses.get("validation"), trainer.engine.module, trainer.parallel)


def pretrain(model_provider: Callable, argv=None, adaptor_kernels: Optional[object] = None,
             data: object = PretrainingData()) -> TrainingResult:
    """Train a GPT as the flags say (see build_trainer for `model_provider`, `adaptor_kernels` and `data`)."""
    started = time.monotonic()  # --exit-duration-in-mins counts from here, start-up included
    try:
        trainer = build_trainer(model_provider, argv, adaptor_kernels, data)
        if trainer.config.logging.skip_train:
            return evaluate_checkpoint(trainer)
        stopping = trainer.config.stopping
        watchdog = Watchdog(dist.get_rank(), stopping.distributed_timeout_minutes)
        exits = ExitRequests(stopping.exit_signal_handler, stopping.exit_duration_in_mins, started)
        try:
            return run_training(trainer, watchdog, exits)
        finally:
            exits.close()
            watchdog.close()
    finally:
        save_lock.release_all()


def tokens_budget_spent(schedule: ScheduleConfig, consumed_tokens: int) -> bool:
    """--train-tokens: stop once that many tokens are consumed."""
    return schedule.train_tokens is not None and consumed_tokens >= schedule.train_tokens


def figures_of_step(trainer: Trainer, state: TrainState, loss, grad_norm, batch_size: int,
                    lr: float, moe: Optional[MoEFigures] = None, curriculum_seqlen: Optional[int] = None
                    ) -> IterationFigures:
    """The iteration's figures for the log (loss, gradient norm and zero count may still be tensors, read later
    by PendingSteps); norms and statistics are collectives, so every rank computes them."""
    config, engine, parallel, clipping = trainer.config, trainer.engine, trainer.parallel, trainer.clipping
    logging_config = config.logging
    figures = IterationFigures(loss=loss, learning_rate=lr, batch_size=batch_size,
                               loss_scale=float(getattr(engine.optimizer, "cur_scale", 1.0)), grad_norm=grad_norm,
                               num_zeros=clipping.num_zeros if clipping else None, moe=moe,
                               consumed_tokens=state.consumed_train_tokens, curriculum_seqlen=curriculum_seqlen)
    if logging_config.log_params_norm:
        figures.params_norm = parameters_norm(engine.module, parallel)
    if logging_config.log_optimizer_states_to_tensorboard and \
            state.iteration % logging_config.tensorboard_log_interval == 0:
        figures.optimizer_states = optimizer_state_statistics(stepped_optimizer(engine.optimizer), parallel,
                                                              partitioned=config.parallel.zero_stage > 0)
    return figures


def resumed_curriculum(config: JobConfig, state: TrainState, recorded_tokens: Optional[int] = None,
                       recorded_seq_length: Optional[int] = None) -> tuple[Optional[SequenceLengthCurriculum], int]:
    """The job's sequence-length curriculum (None without one) caught up with the iterations `state` says were
    trained, and the tokens those consumed. A checkpoint's `recorded_tokens` say whether it trained under a
    curriculum: fewer than its samples x its `recorded_seq_length`. Resumed under another curriculum, without the
    one it had, or with one it never had, its sequence length and token count would jump, so each is refused in
    one line (without a curriculum on either side, a resume may change --seq-length)."""
    samples, load = state.consumed_train_samples, config.checkpoint.load
    full_length = None if recorded_tokens is None or not recorded_seq_length else samples * recorded_seq_length
    if config.curriculum is None:
        if full_length is not None and recorded_tokens < full_length:
            raise InputError(f"--load {load}: its {state.iteration} iterations consumed {recorded_tokens} tokens, "
                             f"fewer than their {samples} samples x --seq-length {recorded_seq_length}: it trained "
                             "under a sequence-length curriculum (the curriculum_learning section of "
                             "--deepspeed_config) and this run has none, so its sequences would jump to full length; "
                             "resume with the section it trained with (past its last step it trains at full length), "
                             "or start a new schedule from its weights with --finetune")
        return None, samples * config.data.seq_length
    curriculum = SequenceLengthCurriculum(config.curriculum)
    tokens = curriculum.replay(state.iteration, config.batch.schedule.batch_size)
    if recorded_tokens is not None and recorded_tokens != tokens and recorded_tokens == full_length:
        raise InputError(f"--load {load}: its {state.iteration} iterations consumed {recorded_tokens} tokens, all "
                         f"{samples} samples at --seq-length {recorded_seq_length}: it trained without a "
                         "sequence-length curriculum, and this run's (the curriculum_learning section of "
                         f"--deepspeed_config) would cut its sequences back, counting {tokens} tokens for them; "
                         "drop the section to resume it, or start a new schedule from its weights with --finetune")
    if recorded_tokens is not None and recorded_tokens != tokens:
        raise InputError(f"--load {load}: its {state.iteration} iterations consumed "
                         f"{recorded_tokens} tokens, but this run's sequence-length curriculum (the curriculum_learning "
                         f"section of --deepspeed_config) gives {tokens} for them: the curriculum "
                         "changed since the checkpoint was saved; resume with the section it trained with, or start "
                         "a new schedule from its weights with --finetune")
    return curriculum, tokens


def compiled_curriculum_note(config: JobConfig, train_iters: int) -> Optional[str]:
    """The line a compiled run under a sequence-length curriculum says once: the chunked loss loops over batch x
    length rows in Python, so torch compiles the model again for every length (marking it dynamic does not help),
    and past its recompile limit runs it uncompiled with a warning of its own."""
    if config.curriculum is None or not config.model.torch_compile:
        return None
    counting = SequenceLengthCurriculum(config.curriculum)  # a scheduler of its own: the run's keeps its state
    lengths = sorted({counting.length(iteration) for iteration in range(train_iters)})
    return (f"--torch-compile with a sequence-length curriculum: the model is compiled once for each of its "
            f"{len(lengths)} lengths ({', '.join(map(str, lengths))}); beyond torch's recompile limit "
            "(torch._dynamo.config.recompile_limit) the remaining lengths run uncompiled")


def iteration_batches(config: JobConfig, curriculum: Optional[SequenceLengthCurriculum], batches: Batches,
                      iteration: int) -> tuple:
    """The training micro-batches of iteration `iteration` + 1 and their length: whole, or cut to the curriculum's
    length then (upstream's get_batch_pipe cuts them so)."""
    if curriculum is None:
        return batches, config.data.seq_length
    length = curriculum.length(iteration)
    return map(functools.partial(truncated_batch, length=length), batches), length


def curriculum_warmup_tokens(config: JobConfig) -> Optional[int]:
    """Under a sequence-length curriculum, the tokens consumed by the end of a sample warmup (where a token decay
    starts, as upstream's scheduler records it); None otherwise."""
    schedule = config.schedule
    if config.curriculum is None or schedule.warmup_tokens is not None or schedule.decay_tokens is None:
        return None
    return SequenceLengthCurriculum(config.curriculum).tokens_at(schedule.warmup_samples,
                                                                 config.batch.schedule.batch_size)


def reduces_gradients(trainer: Trainer) -> bool:
    """Whether DeepSpeed's plain engine must all-reduce the gradients after backward: not with one
    data-parallel rank under ZeRO 0, where that would only copy them into a flat buffer and back (with
    DeepSpeed-Ulysses each sequence-parallel rank holds only its tokens' share, so they are reduced)."""
    return trainer.parallel.get_sequence_data_parallel_world_size() > 1 or trainer.config.parallel.zero_stage > 0


@dataclass
class _RunPhases:
    """What run_training's phases share: the run, its state and the watchdog, timers and monitors around each
    phase."""
    trainer: Trainer
    watchdog: Watchdog
    state: TrainState
    timers: StepTimers
    metrics: MetricsLog
    divergence: DivergenceMonitor

    def save(self) -> None:
        trainer, state, checkpoint = self.trainer, self.state, self.trainer.config.checkpoint
        if not self.divergence.may_save(state.iteration):
            return
        with self.watchdog.phase(f"saving the checkpoint of iteration {state.iteration}"), \
                self.timers.measure("save-checkpoint"):
            self.divergence.require_finite_weights(trainer.engine.module, state.iteration)
            save_checkpoint(trainer.engine, checkpoint.save, trainer.config.flags, state.iteration,
                            state.consumed_train_samples, trainer.rng_tracker, trainer.model_config.vocab_size,
                            trainer.tokenizer.vocab_size, save_optimizer=not checkpoint.no_save_optim,
                            save_rng=not checkpoint.no_save_rng, consumed_train_tokens=state.consumed_train_tokens)

    def validate(self, valid) -> float:
        config, state = self.trainer.config, self.state
        with self.watchdog.phase(f"the evaluation at iteration {state.iteration}"), self.timers.measure("evaluate"):
            loss = evaluate(self.trainer.engine, valid, config.logging.eval_iters, config.batch.num_micro_batches,
                            self.trainer.parallel, deepspeed_checkpointing=config.activation_checkpointing.deepspeed)
        self.metrics.validation(state, loss)
        return loss


@dataclass
class _Settled:
    """The pending iterations' figures once read (pending_steps.PendingSteps): logged, their skipped and bad
    iterations counted, the divergence monitor told (which may raise); the losses and norms kept for the result."""
    phases: _RunPhases
    pending: PendingSteps
    skipped_before: int  # the skipped-step counters' sum before the pending steps
    losses: list
    grad_norms: list

    def settle(self) -> None:
        state, divergence = self.phases.state, self.phases.divergence
        steps = self.pending.take()
        counts = [self.skipped_before] + [step.skipped for step in steps]
        updates_skipped = [after > before for before, after in zip(counts, counts[1:])]
        verdicts = divergence.judge([step.figures.loss for step in steps], updates_skipped)
        for step, update_skipped, bad in zip(steps, updates_skipped, verdicts):
            self.losses.append(step.figures.loss)
            self.grad_norms.append(step.figures.grad_norm)
            state.skipped_iterations += step.skipped - self.skipped_before
            self.skipped_before = step.skipped
            state.nan_iterations += int(bad)
            logged = replace(state, iteration=step.iteration, consumed_train_samples=step.consumed_samples)
            self.phases.metrics.iteration(logged, step.figures)  # which restarts the counters after a log line
            state.skipped_iterations, state.nan_iterations = logged.skipped_iterations, logged.nan_iterations
            divergence.count(step.iteration, bad, step.figures.loss, step.figures.grad_norm, update_skipped)


def _skipped_counters(trainer: Trainer) -> list:
    """DeepSpeed's skipped steps, and ours (Fp32GradientClipping, NonFiniteStepGuard)."""
    return [trainer.engine.skipped_steps, *(hook.skipped for hook in (trainer.clipping, trainer.step_guard)
                                            if hook is not None and hook.skipped is not None)]


def _resume(trainer: Trainer, watchdog: Watchdog) -> TrainState:
    state = TrainState()
    with watchdog.phase("loading the checkpoint"), torch.no_grad():  # the pipeline engine re-synchronises
        state.iteration, state.consumed_train_samples = load_checkpoint(  # tied weights in place while loading
            trainer.engine, trainer.config.checkpoint.load, trainer.rng_tracker, trainer.resume, trainer.parallel)
    return state


def run_training(trainer: Trainer, watchdog: Watchdog, exits: ExitRequests) -> TrainingResult:
    """Resume, train, evaluate and save; each phase under the watchdog (megatron/training/watchdog.py)."""
    config, engine, parallel, clipping = trainer.config, trainer.engine, trainer.parallel, trainer.clipping
    batch, logging_config, checkpoint = config.batch, config.logging, config.checkpoint
    state = _resume(trainer, watchdog)
    resume = trainer.resume
    curriculum, state.consumed_train_tokens = resumed_curriculum(
        config, state, *((resume.tokens, resume.seq_length) if resume is not None else ()))
    with watchdog.phase("building the datasets"):
        train_batches, valid = build_batches(trainer, state)
    with releasing(train_batches, valid):
        schedule = learning_rate_schedule(config.schedule, curriculum_warmup_tokens(config))
        train_iters = config.schedule.total_iterations(batch)
        note = compiled_curriculum_note(config, train_iters)
        if note and state.iteration == 0:
            log_last_rank(note)
        timers = StepTimers(logging_config.timing_log_level)
        phases = _RunPhases(trainer, watchdog, state, timers,
                            MetricsLog(config, trainer.model_config, train_iters, is_last_rank(), timers),
                            DivergenceMonitor(config.stopping.max_consecutive_nan_iterations, config.precision.fp16,
                                              checkpoint.save))
        validation_loss = None
        pipelined = isinstance(engine, PipelineEngine)
        pending = PendingSteps(None if pipelined else parallel.get_data_parallel_group(),
                               1 if pipelined else parallel.get_data_parallel_world_size())
        # a resumed run's DeepSpeed counts on
        settled = _Settled(phases, pending, round(sum(read_to_host(_skipped_counters(trainer)))), [], [])
        reduce_gradients = reduces_gradients(trainer)
        # Every rank takes the pending figures at the same iterations (their reading is a collective), so this
        # asks whether the run writes TensorBoard or W&B at all, not whether this rank does (only the last one does).
        scalar_interval = logging_config.scalar_log_interval
        while state.iteration < train_iters and not tokens_budget_spent(config.schedule, state.consumed_train_tokens):
            batch_size = batch.schedule.batch_size(state.consumed_train_samples)
            step_batches, length = iteration_batches(config, curriculum, train_batches, state.iteration)
            with watchdog.phase(f"iteration {state.iteration + 1}", deadline=True), timers.measure("train-step"):
                if batch_size != engine.train_batch_size():  # --rampup-batch-size: more accumulation steps
                    engine.set_train_batch_size(batch_size)
                set_learning_rate(engine.optimizer, schedule(state.consumed_train_samples,
                                                             consumed_tokens=state.consumed_train_tokens))
                loss, moe = train_step(engine, step_batches,
                                       batch.schedule.micro_batches(state.consumed_train_samples), parallel,
                                       reduce_gradients)
                grad_norm = clipping.norm if clipping else engine.get_global_grad_norm()
                skipped = _skipped_counters(trainer)
                exit_reason = exits.reason()
            state.iteration += 1
            state.consumed_train_samples += batch_size
            state.consumed_train_tokens += batch_size * length
            pending.add(StepRecord(state.iteration, state.consumed_train_samples, figures_of_step(
                trainer, state, loss, 0.0 if grad_norm is None else grad_norm, batch_size,
                schedule(state.consumed_train_samples, consumed_tokens=state.consumed_train_tokens), moe,
                None if curriculum is None else length), skipped, loss_averaged=moe is not None))
            exit_interval = logging_config.exit_interval
            exiting = bool(exit_interval) and state.iteration % exit_interval == 0
            saving = checkpoint.save and (state.iteration % checkpoint.save_interval == 0 or exiting or exit_reason)
            finished = state.iteration >= train_iters or tokens_budget_spent(config.schedule,
                                                                             state.consumed_train_tokens)
            if saving or exiting or exit_reason or finished or \
                    due(state.iteration, logging_config.log_interval, scalar_interval):
                settled.settle()

            paused = time.perf_counter()
            if valid is not None and state.iteration % logging_config.eval_interval == 0:
                validation_loss = phases.validate(valid)
            if saving:
                phases.save()
            phases.metrics.exclude_from_timing(time.perf_counter() - paused)
            if exiting or exit_reason:
                saved = f"checkpoint saved to {checkpoint.save}" if checkpoint.save else "nothing saved (no --save)"
                log_last_rank(exit_line(state.iteration, exit_reason and f"{exit_reason}; {saved}"))
                break
        else:
            phases.divergence.require_recovered(state.iteration)
            if checkpoint.save and state.iteration % checkpoint.save_interval:
                phases.save()
            if valid is not None and state.iteration % logging_config.eval_interval:
                validation_loss = phases.validate(valid)
            evaluate_splits(trainer, state.iteration, ("test",))
        phases.metrics.close()
        return TrainingResult(state.iteration, settled.losses, settled.grad_norms, validation_loss, engine.module,
                              parallel)
