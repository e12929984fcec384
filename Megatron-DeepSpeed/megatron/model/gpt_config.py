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
from megatron.families.rope_scaling import RopeScaling

RENAMED = {"seed": "init_seed"}  # ModelConfig field -> GPTConfig field
NOT_FLAGS = ("vocab_size", "kernels", "moe", "rope_scaling")  # GPTConfig fields no single flag of ModelConfig gives
# The flags that make GPTConfig's rope_scaling (families/rope_scaling.ROPE_SCALING_FLAGS): ModelConfig field ->
# RopeScaling field.
ROPE_SCALING_FIELDS = {"rope_scaling_type": "kind", "rope_scaling_factor": "factor",
                      "rope_scaling_original_max_position_embeddings": "original_max_position_embeddings",
                      "rope_scaling_low_freq_factor": "low_freq_factor",
                      "rope_scaling_high_freq_factor": "high_freq_factor", "yarn_beta_fast": "beta_fast",
                      "yarn_beta_slow": "beta_slow", "yarn_mscale": "mscale", "yarn_mscale_all_dim": "mscale_all_dim",
                      "yarn_attention_factor": "attention_factor", "yarn_correction_range_round_to_int": "truncate"}


def gpt_config(model: ModelConfig, padded_vocab_size: int, kernels: Kernels = PORTABLE_KERNELS,
               moe: Optional[MoEConfig] = None) -> GPTConfig:
    """The GPTConfig of `model` with `padded_vocab_size` embedding rows and `kernels`; `moe`: its experts (the
    MoE flags' own section, config/flags/moe.py; None: dense)."""
    values = {RENAMED.get(name, name): value for name, value in model.to_flags().items()
              if name not in ROPE_SCALING_FIELDS}
    scaling = RopeScaling(**{field: getattr(model, flag) for flag, field in ROPE_SCALING_FIELDS.items()})
    return GPTConfig(vocab_size=padded_vocab_size, kernels=kernels, moe=moe, rope_scaling=scaling, **values)


def model_config_of(config: GPTConfig) -> ModelConfig:
    """The flags of a model built straight from a GPTConfig (tools and tests do), e.g. to export it."""
    flag_of = {gpt_name: flag for flag, gpt_name in RENAMED.items()}
    scaling = {flag: getattr(config.rope_scaling, field) for flag, field in ROPE_SCALING_FIELDS.items()}
    return ModelConfig(**scaling, **{flag_of.get(spec.name, spec.name): getattr(config, spec.name)
                                     for spec in fields(config) if spec.name not in NOT_FLAGS})
