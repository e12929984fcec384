"""What a reader of a checkpoint hands on: its weights (Checkpoint, formats/reader.py) and its Adam state per full
parameter (OptimizerState, formats/optimizer_state.py), whatever layout they were read from."""
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from megatron.checkpoint.formats.detect import Layout
from megatron.config.recorded_flags import RecordedFlags
from megatron.config.job import MoEConfig
from megatron.config.model_config import ModelConfig


@dataclass(frozen=True)
class Checkpoint:
    directory: str  # the global_step{N} directory read
    iteration: int
    consumed_train_samples: int
    args: Mapping[str, object]  # the flags of the run that wrote it (plain values)
    layout: Layout
    padded_vocab_size: int
    model: Mapping[str, torch.Tensor]  # full tensors (or a TensorShard's) under GPTModel's names, training dtype
    has_optimizer_state: bool  # False: saved with --no-save-optim, or converted with --weights-only
    old: bool = False  # written by an earlier version of this project (pipeline pieces numbered from 0)
    gate_up: Optional[str] = None  # --swiglu: how the files hold dense_h_to_4h's rows (detect.gate_up_rows); the
    # model and the Adam state as read are in the model's [gate; up] halves whatever it is

    @property
    def model_config(self) -> ModelConfig:
        """The model the recorded flags describe (dropout and activation checkpointing as trained)."""
        return ModelConfig.from_flags(self.args, f"the flags recorded in {self.directory}")

    @property
    def flags(self) -> RecordedFlags:
        """The recorded flags, typed, with the flag groups' defaults for those it lacks."""
        return RecordedFlags.of(self.args)

    @property
    def moe(self) -> Optional[MoEConfig]:
        """Its mixture of experts as a single process holds them all (None: dense)."""
        return self.flags.whole_model_moe


@dataclass(frozen=True)
class OptimizerState:
    step: int
    fp32: Mapping[str, torch.Tensor]  # master weights
    exp_avg: Mapping[str, torch.Tensor]
    exp_avg_sq: Mapping[str, torch.Tensor]
    param_groups: tuple  # AdamW's hyperparameters per group (decayed, not decayed), without 'params'
    loss_scale: Optional[Mapping] = None  # an fp16/bf16 run's at ZeRO 0 (mixed_precision_state.LOSS_SCALE_KEYS)

    def tensors(self, kind: str) -> Mapping[str, torch.Tensor]:
        return getattr(self, kind)


def without_params(groups) -> tuple:
    """Saved parameter groups' hyperparameters, without torch's parameter indices."""
    return tuple({key: value for key, value in group.items() if key != "params"} for group in groups)
