"""The one place the model flags (config/model_config.ModelConfig) become model/gpt.py's GPTConfig, with what no
flag says: the padded vocabulary and the kernels. model/gpt.py itself stays free of the configuration layer.

Fields carry the same names on both sides except those in RENAMED, so a new model flag reaches the model as soon as
both dataclasses have it (and GPTConfig refuses a flag it lacks instead of dropping it).
"""
from dataclasses import fields
from typing import Optional

from megatron.config.job import MoEConfig
from megatron.config.model_config import ModelConfig
from megatron.model.gpt import GPTConfig
from megatron.model.kernels import PORTABLE_KERNELS, Kernels

RENAMED = {"seed": "init_seed"}  # ModelConfig field -> GPTConfig field
NOT_FLAGS = ("vocab_size", "kernels", "moe")  # GPTConfig fields no flag of ModelConfig gives


def gpt_config(model: ModelConfig, padded_vocab_size: int, kernels: Kernels = PORTABLE_KERNELS,
               moe: Optional[MoEConfig] = None) -> GPTConfig:
    """The GPTConfig of `model` with `padded_vocab_size` embedding rows and `kernels`; `moe`: its experts (the
    MoE flags' own section, config/flags/moe.py; None: dense)."""
    values = {RENAMED.get(name, name): value for name, value in model.to_flags().items()}
    return GPTConfig(vocab_size=padded_vocab_size, kernels=kernels, moe=moe, **values)


def model_config_of(config: GPTConfig) -> ModelConfig:
    """The flags of a model built straight from a GPTConfig (tools and tests do), e.g. to export it."""
    flag_of = {gpt_name: flag for flag, gpt_name in RENAMED.items()}
    return ModelConfig(**{flag_of.get(spec.name, spec.name): getattr(config, spec.name) for spec in fields(config)
                          if spec.name not in NOT_FLAGS})
