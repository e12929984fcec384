"""The flags a checkpoint records (its client state's `args`), read as one typed view: each flag the checkpoint
lacks (an older or upstream checkpoint) takes the default its flag group defines (config/arguments.flag_defaults),
and the questions the checkpoint code asks of them (precision, the layout, the experts' split, the optimizer's
hyperparameters, the tokenizer) are answered here, once, instead of by string lookups where they are needed.
Each flag is read as the type the JobConfig's section (or ModelConfig) declares for it, so that type is written
once; a recorded value of another type is an InputError naming the flag."""
import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

import torch

from megatron.config.arguments import flag_defaults
from megatron.config.flags.moe import recorded_moe_config
from megatron.config.job import DataConfig, MoEConfig, OptimizerConfig, ParallelConfig, PrecisionConfig, TokenizerConfig
from megatron.config.model_config import ModelConfig, typed_flag

SOURCE = "the checkpoint's recorded flags"


@lru_cache(maxsize=1)
def _defaults() -> Mapping[str, object]:
    return MappingProxyType(flag_defaults())


@dataclass(frozen=True)
class RecordedFlags:
    """`values`: every flag, as recorded or else its default; `recorded`: what the checkpoint holds, as it holds
    it (a converter writes it back)."""
    values: Mapping[str, object]
    recorded: Mapping[str, object]

    @classmethod
    def of(cls, recorded: Mapping[str, object]) -> "RecordedFlags":
        return cls(MappingProxyType({**_defaults(), **recorded}), MappingProxyType(dict(recorded)))

    def records(self, flag: str) -> bool:
        return flag in self.recorded

    def typed(self, section: type, field: str, flag: Optional[str] = None):
        """The recorded value of `flag` (`field` when the section names it alike) as `section.field` declares it."""
        declared = section.__dataclass_fields__[field].type
        value = self.values[flag or field]
        return None if value is None else typed_flag(declared, flag or field, value, SOURCE)

    def section(self, kind: type):
        """The JobConfig section `kind` whose fields are named as their flags (precision, optimizer, tokenizer),
        typed."""
        return kind(**{field: self.typed(kind, field) for field in kind.__dataclass_fields__})

    # --- the model and the layout it was written at

    @property
    def num_layers(self) -> int:
        return self.typed(ModelConfig, "num_layers")

    @property
    def tensor_parallel(self) -> int:
        return self.typed(ParallelConfig, "tensor", "tensor_model_parallel_size")

    @property
    def pipeline_parallel(self) -> int:
        return self.typed(ParallelConfig, "pipeline", "pipeline_model_parallel_size")

    @property
    def data_parallel(self) -> int:
        return self.typed(ParallelConfig, "data", "data_parallel_size")

    @property
    def zero_partitions(self) -> int:
        """The ranks ZeRO partitioned the optimizer state over: data- x DeepSpeed-Ulysses sequence-parallel."""
        return self.data_parallel * self.typed(ParallelConfig, "ds_sequence_parallel_size")

    @property
    def zero_stage(self) -> int:
        return self.typed(ParallelConfig, "zero_stage")

    @property
    def model_parallel_ranks(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def pipeline_engine(self) -> bool:
        """DeepSpeed's pipeline engine (upstream's default) or its plain engine (upstream records
        ds_pipeline_enabled, this project --no-pipeline-parallel)."""
        if "ds_pipeline_enabled" in self.values:
            return self.typed(ParallelConfig, "pipeline_engine", "ds_pipeline_enabled")
        return not self.typed(ParallelConfig, "pipeline_engine", "no_pipeline_parallel")

    @property
    def untied(self) -> bool:
        """Whether the model has an output layer of its own (not the tied word embedding)."""
        return self.typed(ModelConfig, "untie_embeddings_and_output_weights")

    @property
    def padded_vocab_size(self) -> Optional[int]:
        rows = self.values.get("padded_vocab_size")
        return None if rows is None else int(rows)

    @property
    def tokenizer_vocab_size(self) -> Optional[int]:
        """The tokenizer's own vocabulary size, recorded since checkpoints record it (None: older ones)."""
        size = self.values.get("tokenizer_vocab_size")
        return int(size) if size else None

    @property
    def max_position_embeddings(self) -> int:
        return self.typed(ModelConfig, "max_position_embeddings")

    @property
    def seq_length(self) -> int:
        return self.typed(DataConfig, "seq_length")

    @property
    def seed(self) -> int:
        return self.typed(DataConfig, "seed")

    # --- precision and the optimizer

    @property
    def precision(self) -> str:
        """fp16, bf16 or fp32."""
        return self.section(PrecisionConfig).name

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights were trained in."""
        return self.section(PrecisionConfig).params_dtype

    @property
    def adam_param_groups(self) -> Tuple[dict, dict]:
        """AdamW's two parameter groups (decayed, not decayed) with these hyperparameters, without 'params'."""
        adam = self.section(OptimizerConfig)
        common = {"lr": adam.lr or 0.0, "betas": (adam.adam_beta1, adam.adam_beta2), "eps": adam.adam_eps}
        return {**common, "weight_decay": adam.weight_decay}, {**common, "weight_decay": 0.0}

    @property
    def clip_grad(self) -> float:
        return self.section(OptimizerConfig).clip_grad

    @property
    def loss_scaler(self) -> dict:
        """DeepSpeed's loss scaler settings of these flags: a static scale, or the dynamic one's start and window
        (mixed_precision_state.target_loss_scale adds the steps)."""
        scaling = self.section(PrecisionConfig)
        if scaling.loss_scale:
            return {"dynamic_loss_scale": False, "cur_scale": scaling.loss_scale}
        return {"dynamic_loss_scale": True, "cur_scale": scaling.initial_loss_scale,
                "scale_window": scaling.loss_scale_window}

    # --- mixture of experts

    @property
    def moe(self) -> MoEConfig:
        return recorded_moe_config(self.recorded)

    @property
    def has_experts(self) -> bool:
        return self.moe.enabled

    @property
    def expert_parallel(self) -> int:
        return self.typed(MoEConfig, "expert_parallel_size", "moe_expert_parallel_size") or 1

    @property
    def experts_split(self) -> bool:
        """Whether the experts, and PR-MoE's dense MLP beside them, are split over the tensor-parallel ranks
        (--enable-expert-tensor-parallelism; at tensor-parallel size 1 nothing is split)."""
        return self.moe.expert_tensor_parallel

    @property
    def whole_model_moe(self) -> Optional[MoEConfig]:
        """The MoE section for a model holding every expert whole (expert-parallel size 1, experts not split over
        tensor-parallel ranks); None for a dense model."""
        moe = self.moe
        return dataclasses.replace(moe, expert_parallel_size=1, expert_tensor_parallel=False) if moe.enabled else None

    @property
    def moe_param_group(self) -> bool:
        """--create-moe-param-group: the experts' parameters in DeepSpeed's MoE optimizer groups."""
        return self.typed(MoEConfig, "create_param_group", "create_moe_param_group")

    # --- the tokenizer

    @property
    def tokenizer_type(self) -> str:
        return self.section(TokenizerConfig).tokenizer_type

    @property
    def tokenizer_files(self) -> dict:
        """The tokenizer flags build_tokenizer takes besides its type."""
        tokenizer = dataclasses.asdict(self.section(TokenizerConfig))
        return {flag: tokenizer[flag] for flag in ("vocab_file", "merge_file", "tokenizer_model", "vocab_size")}

    @property
    def make_vocab_size_divisible_by(self) -> int:
        return self.section(TokenizerConfig).make_vocab_size_divisible_by
