"""The Hugging Face adapter of Mistral: Llama's tensors and config keys (llama/hf_adapter.py), no linear biases
(MistralConfig has no attention_bias / mlp_bias), and sliding-window attention.

    config.json sliding_window W (null: none)  <->  --window-size W - 1 (model/attention_spec.py: transformers'
                                                     query i sees keys i - W < j <= i)

A windowless model is also Llama's (the same computation and tensors under the same names): an export picks the
class the checkpoint was imported from (families/registry.py), so a windowless Mistral (v0.3) comes back as
MistralForCausalLM with sliding_window null, and a windowless model of any other origin as LlamaForCausalLM.
"""
from typing import Iterator, Mapping, Optional, Tuple

import torch

from megatron.errors import InputError
from megatron.families.adapter import BuiltModel, ModelFlags
from megatron.families.hf_tensors import MODEL_FLAGS_KEY, DerivedWeights, taker
from megatron.families.llama import hf_adapter as llama

MODEL_TYPE = "mistral"
ARCHITECTURE = "MistralForCausalLM"
EMBEDDING = llama.EMBEDDING
ALWAYS_TIED = llama.ALWAYS_TIED
MISTRAL_FLAGS = {**llama.LLAMA_FLAGS, "add_bias_linear": False}


def holds(model: ModelFlags) -> bool:
    """Whether MistralForCausalLM can hold `model`: Llama's flags without linear biases, any window."""
    return (all(getattr(model, flag) == value for flag, value in MISTRAL_FLAGS.items())
            and set(model.variant_names()) <= llama.HELD_VARIANTS | {"window_size"})


def window_from_hf(config: Mapping[str, object], path: str) -> Optional[int]:
    """--window-size of config.json's sliding_window (None: no window)."""
    window = config.get("sliding_window")
    if window is None:
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise InputError(f"{path} sets sliding_window {window!r}; it must be a whole number of keys, 1 or more, "
                         "or null for none")
    return window - 1


def model_flags_from_hf(config: Mapping[str, object], source: str) -> dict:
    """The model flags of a Mistral config.json (Llama's keys and sliding_window; a key it lacks takes
    MistralConfig's default, a 4096-key window included)."""
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise InputError(f"{source} sets attention_bias / mlp_bias, which MistralForCausalLM does not have; "
                         "save it as model_type 'llama' to import linear biases")
    window = window_from_hf({"sliding_window": 4096, **config}, source)
    return {**llama.model_flags_from_hf(config, source), **MISTRAL_FLAGS, "window_size": window}


def to_hf_tensors(model: Mapping[str, torch.Tensor], config: BuiltModel,
                  vocab_size: int) -> Iterator[Tuple[str, torch.Tensor]]:
    """Llama's tensors (Mistral has the same under the same names)."""
    return llama.to_hf_tensors(model, config, vocab_size)


def from_hf_state_dict(hf: Mapping[str, torch.Tensor], config: BuiltModel) -> Mapping[str, torch.Tensor]:
    """MistralForCausalLM's weights under GPTModel's names, each converted when asked."""
    return DerivedWeights(llama.recipes(taker(hf, "Mistral model"), config))


def hf_config(model: ModelFlags, vocab_size: int, dtype: torch.dtype,
              special_tokens: Optional[Mapping[str, object]] = None) -> dict:
    """config.json of the MistralForCausalLM equal to `model`: Llama's keys without its bias switches, and the
    window."""
    config = {key: value for key, value in llama.hf_config(model, vocab_size, dtype, special_tokens).items()
              if key not in ("attention_bias", "mlp_bias")}
    ours = {flag: value for flag, value in config[MODEL_FLAGS_KEY].items() if flag != "window_size"}
    window = None if model.window_size is None else model.window_size + 1
    return {**config, "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, MODEL_FLAGS_KEY: ours,
            "sliding_window": window}


def describe(config: Mapping[str, object]) -> list:
    """What the examiner shows of a Mistral config.json beyond its shape."""
    window = config.get("sliding_window", 4096)
    shown = "none" if window is None else f"each token sees itself and the {window - 1} tokens before it"
    return [*llama.describe(config), f"sliding window: {shown}"]
