"""The typed configuration of a training job, built once from the validated flags and frozen.

Each flag group of megatron/config/flags/ builds its section from the validated values, and
`megatron.config.arguments.job_config` puts them together. From then on nothing changes them, and each part
of the system takes only the section it needs: the data loaders a DataConfig, the optimizer an
OptimizerConfig, and so on. `JobConfig.flags` keeps the flags as plain values: that is what a checkpoint
records, so checkpoints stay readable without this code base.
"""
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

import torch

from megatron.config.batch_schedule import BatchSchedule
from megatron.config.model_config import ModelConfig  # the model section: one mapping of its flags


@dataclass(frozen=True)
class MoEConfig:
    """Mixture of experts (megatron/config/flags/moe.py): which layers hold DeepSpeed MoE layers, and theirs
    options. Dense when every count is 1."""
    num_experts: Tuple[int, ...]  # as given: one count, or one per MoE layer
    expert_interval: int
    mlp_type: str  # "residual": PR-MoE, the dense MLP plus the experts mixed by a learned coefficient
    topk: int
    train_capacity_factor: float
    eval_capacity_factor: float
    min_capacity: int
    token_dropping: bool
    loss_coeff: float  # weight of the summed load-balancing losses added to the LM loss
    create_param_group: bool
    expert_parallel_size: int
    expert_tensor_parallel: bool = False  # experts split over the tensor-parallel ranks like the dense MLP

    def experts_of_layer(self, layer_number: int) -> int:
        """Experts of 1-based transformer layer `layer_number` (1: a dense MLP), as upstream assigns them: layers
        whose number is a multiple of expert_interval, counted from the list in order."""
        if layer_number % self.expert_interval:
            return 1
        index = (layer_number - 1) // self.expert_interval
        return self.num_experts[0] if len(self.num_experts) == 1 else self.num_experts[index]

    @property
    def enabled(self) -> bool:
        return max(self.num_experts) > 1


@dataclass(frozen=True)
class ActivationCheckpointingConfig:
    """How --checkpoint-activations recomputes: torch.utils.checkpoint, or deepspeed.checkpointing with these
    options of deepspeed.checkpointing.configure."""
    deepspeed: bool  # --deepspeed-activation-checkpointing
    partition_activations: bool
    contiguous_checkpointing: bool  # upstream's --contigious-checkpointing
    checkpoint_in_cpu: bool
    synchronize: bool  # --synchronize-each-layer
    profile: bool  # --profile-backward


@dataclass(frozen=True)
class ParallelConfig:
    tensor: int
    pipeline: int
    data: int
    world_size: int
    sequence_parallel: bool
    pipeline_engine: bool  # DeepSpeed's pipeline engine (the default, as upstream) or its plain engine
    zero_stage: int
    distributed_backend: str
    # ZeRO flags that become DeepSpeed config keys when given (0 / False / "none": DeepSpeed's default).
    zero_reduce_scatter: bool
    zero_contigious_gradients: bool
    zero_reduce_bucket_size: int
    zero_allgather_bucket_size: int
    remote_device: str
    use_pin_memory: bool
    # DeepSpeed-Ulysses: ranks sharing each sequence (model/ulysses.py); world = tensor x pipeline x data x this.
    ds_sequence_parallel_size: int = 1
    zero_stage_chosen: bool = True  # by --zero-stage or the JSON; False: the default, or a resumed checkpoint's
    zero_stage_note: Optional[str] = None  # the line that says why one data-parallel rank has the default stage


@dataclass(frozen=True)
class BatchConfig:
    micro_batch_size: int
    global_batch_size: int
    num_micro_batches: int  # gradient-accumulation steps per optimizer step (once any ramp-up is over)
    rampup: Optional[Tuple[int, int, int]]  # --rampup-batch-size START INCREMENT SAMPLES

    @property
    def schedule(self) -> BatchSchedule:
        """The global batch size of every iteration."""
        return BatchSchedule(self.global_batch_size, self.global_batch_size // self.num_micro_batches, self.rampup)


@dataclass(frozen=True)
class ScheduleConfig:
    """Training length and Megatron's learning-rate schedule, counted in samples."""
    train_iters: Optional[int]
    train_samples: Optional[int]
    lr: float
    min_lr: float
    decay_style: str
    warmup_samples: float
    decay_samples: int
    train_tokens: Optional[int]  # also stop once this many tokens are consumed
    tokens_per_sample: int  # --seq-length
    warmup_tokens: Optional[int]  # --lr-warmup-tokens: replaces the sample warmup
    decay_tokens: Optional[int]  # --lr-decay-tokens: replaces the sample decay

    def total_iterations(self, batch: "BatchConfig") -> int:
        return self.train_iters or batch.schedule.iterations(self.train_samples)

    def total_samples(self, global_batch_size: int) -> int:
        return self.train_samples or self.train_iters * global_batch_size


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float
    cpu_optimizer: bool  # ZeRO keeps the optimizer state (and steps it) on the CPU
    optimizer: str  # "adam" (AdamW) or "sgd"
    sgd_momentum: float


@dataclass(frozen=True)
class PrecisionConfig:
    fp16: bool
    bf16: bool
    loss_scale: Optional[float]  # None: dynamic loss scaling
    initial_loss_scale: float
    min_loss_scale: float
    loss_scale_window: int
    hysteresis: int

    @property
    def name(self) -> str:
        """"fp16", "bf16" or "fp32": the dtype the run trains in."""
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"

    @property
    def params_dtype(self) -> torch.dtype:
        return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[self.name]


@dataclass(frozen=True)
class TokenizerConfig:
    tokenizer_type: str
    vocab_file: Optional[str]
    merge_file: Optional[str]
    tokenizer_model: Optional[str]
    vocab_size: Optional[int]
    make_vocab_size_divisible_by: int


@dataclass(frozen=True)
class DataConfig:
    data_path: Tuple[str, ...]
    # Upstream main's --train-data-path / --valid-data-path / --test-data-path, each split's data read whole
    # (empty for a split without one); () with --data-path.
    split_data_paths: Tuple[Tuple[str, ...], ...]
    split: str
    mock_data: bool
    data_cache_path: Optional[str]
    num_workers: int
    seq_length: int
    seed: int
    reset_position_ids: bool
    reset_attention_mask: bool
    eod_mask_loss: bool
    dataloader_type: str  # "single" or "cyclic"
    repeated_dataloader: bool = False  # upstream main's; accepted (samples cover every iteration)
    pack_sequences: bool = False  # fine-tuning: whole examples packed per sequence (megatron/data/sft_dataset.py)
    overlong_examples: str = "truncate"  # fine-tuning: an example longer than a sample, "truncate" or "drop"


@dataclass(frozen=True)
class CheckpointConfig:
    save: Optional[str]
    load: Optional[str]
    save_interval: Optional[int]
    finetune: bool  # the loading flags, with Megatron's meanings (megatron/checkpoint/trainer/resume_plan.py)
    no_load_optim: bool
    no_load_rng: bool
    no_save_optim: bool
    override_lr_scheduler: bool
    use_checkpoint_lr_scheduler: bool
    reset_iteration: bool  # restore everything but the iteration and sample counts
    no_save_rng: bool
    universal_checkpoint: bool  # --load's latest_universal, through DeepSpeed's universal loader
    trust_checkpoint: Tuple[str, ...]  # types --load's files may hold beyond the allow-list (checkpoint/trust.py)


@dataclass(frozen=True)
class LoggingConfig:
    log_interval: int
    eval_interval: int
    eval_iters: int
    tensorboard_dir: Optional[str]
    exit_interval: Optional[int]
    skip_train: bool  # evaluate the loaded checkpoint instead of training
    log_params_norm: bool
    log_num_zeros_in_grad: bool
    timing_log_level: int
    tensorboard_log_interval: int
    tensorboard_queue_size: int
    log_timers_to_tensorboard: bool
    log_batch_size_to_tensorboard: bool
    log_learning_rate_to_tensorboard: bool
    log_loss_scale_to_tensorboard: bool
    log_validation_ppl_to_tensorboard: bool
    log_optimizer_states_to_tensorboard: bool
    log_memory_to_tensorboard: bool
    wandb_project: str
    wandb_exp_name: str
    wandb_save_dir: str
    wandb_entity: Optional[str]
    wandb_required: bool

    @property
    def scalar_log_interval(self) -> Optional[int]:
        """Iterations between TensorBoard / W&B points; None when neither is written."""
        writes = self.tensorboard_dir or self.wandb_project or self.wandb_exp_name
        return self.tensorboard_log_interval if writes else None


@dataclass(frozen=True)
class StoppingConfig:
    """When a run stops before its last iteration, and how long a rank waits for its peers."""
    max_consecutive_nan_iterations: int  # bad iterations in a row that end a diverged run
    exit_signal_handler: bool  # SIGTERM: save a checkpoint and exit 0
    exit_duration_in_mins: Optional[float]  # likewise once the run has lasted this long
    distributed_timeout_minutes: float  # a collective that waits longer ends the run


@dataclass(frozen=True)
class JobConfig:
    model: ModelConfig
    moe: MoEConfig
    activation_checkpointing: ActivationCheckpointingConfig
    parallel: ParallelConfig
    batch: BatchConfig
    schedule: ScheduleConfig
    optimizer: OptimizerConfig
    precision: PrecisionConfig
    tokenizer: TokenizerConfig
    data: DataConfig
    checkpoint: CheckpointConfig
    logging: LoggingConfig
    stopping: StoppingConfig
    deepspeed_config: Optional[str]  # the path of the user's DeepSpeed JSON, if any
    deepspeed_json: Optional[Mapping[str, Any]]  # its content, read once while the flags were checked
    flags: Mapping[str, Any]  # every flag as a plain value, as checkpoints record them
    # the JSON's enabled sequence-length curriculum, checked (config/curriculum.py); None: every batch whole
    curriculum: Optional[Mapping[str, Any]] = None
