"""Hugging Face model directories by architecture: which adapter (hf_gpt2.py, hf_llama.py) reads a config.json or
writes one of our models. Each adapter offers the same functions: holds(ModelConfig), model_config_from_hf(config,
path), hf_config(model, vocab_size, dtype, special_tokens), from_hf_state_dict(weights, GPTConfig) (lazy),
to_hf_tensors(model, GPTConfig, vocab_size) (one tensor at a time) and describe(config)."""
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Mapping, Optional

import torch

from megatron.checkpoint import hf_gpt2, hf_llama
from megatron.checkpoint.hf_files import CONFIG_FILE, open_weights, read_config_json
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError
from megatron.model.gpt_config import gpt_config

ADAPTERS = (hf_gpt2, hf_llama)


def adapter_for_config(config: Mapping[str, object], path: str) -> ModuleType:
    """The adapter of a config.json's model_type (and architectures, when listed)."""
    architectures = config.get("architectures") or []
    for adapter in ADAPTERS:
        if config.get("model_type") == adapter.MODEL_TYPE and (not architectures or
                                                               adapter.ARCHITECTURE in architectures):
            return adapter
    listed = ", ".join(architectures) or "no architectures listed"
    known = " and ".join(f"{adapter.MODEL_TYPE} ({adapter.ARCHITECTURE})" for adapter in ADAPTERS)
    raise InputError(f"{path} describes a '{config.get('model_type')}' model ({listed}); only {known} can be "
                     "imported")


def adapter_for_model(model: ModelConfig, source: str) -> ModuleType:
    """The adapter whose architecture holds `model`, or an InputError naming its variants."""
    for adapter in ADAPTERS:
        if adapter.holds(model):
            return adapter
    raise InputError(f"--to-hf: {source} holds a model with {', '.join(model.variants())}, which neither "
                     "transformers' GPT-2 nor Llama can hold (Llama needs --normalization rmsnorm, "
                     "--use-rotary-position-embeddings at --rotary-percent 1, --swiglu and no position embedding)")


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face model directory as read: its config.json, adapter and model flags."""
    directory: str
    config: dict
    adapter: ModuleType
    model_config: ModelConfig

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    def weights(self, padded_vocab_size: Optional[int] = None) -> Mapping[str, torch.Tensor]:
        """The weights under our names, converted when asked, the vocabulary rows zero-padded to
        `padded_vocab_size` (default: none)."""
        config = gpt_config(self.model_config, padded_vocab_size or self.vocab_size)
        return self.adapter.from_hf_state_dict(open_weights(self.directory), config)


def read_hf_model(directory: str) -> HFModel:
    """Read `directory`'s config.json: which architecture, which model."""
    config = read_config_json(directory)
    path = os.path.join(directory, CONFIG_FILE)
    adapter = adapter_for_config(config, path)
    if not isinstance(config.get("vocab_size"), int) or config["vocab_size"] < 1:
        raise InputError(f"{path} sets vocab_size {config.get('vocab_size')!r}; it must be a positive integer")
    return HFModel(directory, config, adapter, adapter.model_config_from_hf(config, path))
