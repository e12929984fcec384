"""The Hugging Face adapter of Qwen3: Llama's tensors and config keys (llama/hf_adapter.py) plus an RMSNorm of
each query and key head (--qk-layernorm) and a head size of its own (config.json's head_dim, our --kv-channels);
no linear biases. Sliding-window layers (as Qwen2's, qwen2/hf_adapter.py) and attention_bias are refused.

    ours                                   transformers Qwen3ForCausalLM
    self_attention.q_norm.weight [d]  <->  self_attn.q_norm.weight
    self_attention.k_norm.weight [d]  <->  self_attn.k_norm.weight
"""
from typing import Iterator, Mapping, Optional, Tuple

import torch

from megatron.errors import InputError
from megatron.families.adapter import BuiltModel, ModelFlags
from megatron.families.hf_tensors import MODEL_FLAGS_KEY, DerivedWeights, taker
from megatron.families.llama import hf_adapter as llama
from megatron.families.qwen2 import hf_adapter as qwen2

MODEL_TYPE = "qwen3"
ARCHITECTURE = "Qwen3ForCausalLM"
EMBEDDING = llama.EMBEDDING
ALWAYS_TIED = llama.ALWAYS_TIED
QWEN3_FLAGS = {**llama.LLAMA_FLAGS, "add_bias_linear": False, "qk_layernorm": True}
_NORMS = ("q_norm", "k_norm")


def holds(model: ModelFlags) -> bool:
    """Whether Qwen3ForCausalLM can hold `model`: Llama's flags with per-head q/k norms, no linear biases."""
    return (all(getattr(model, flag) == value for flag, value in QWEN3_FLAGS.items())
            and set(model.variant_names()) <= llama.HELD_VARIANTS | {"qk_layernorm"})


def model_flags_from_hf(config: Mapping[str, object], source: str) -> dict:
    """The model flags of a Qwen3 config.json (Llama's keys, head_dim included; a key it lacks takes Qwen3Config's
    default)."""
    qwen2.check_config(config, source)
    if config.get("attention_bias"):
        raise InputError(f"{source} sets attention_bias, which adds biases to the attention's four projections "
                         "only; that is not implemented here (--add-qkv-bias covers q, k and v)")
    return {**llama.model_flags_from_hf(config, source), **QWEN3_FLAGS}


def head_norms(layer: int) -> Iterator[Tuple[str, str]]:
    """(ours, theirs) of one layer's query and key norm weights."""
    return ((f"layers.{layer}.self_attention.{norm}.weight", f"model.layers.{layer}.self_attn.{norm}.weight")
            for norm in _NORMS)


def to_hf_tensors(model: Mapping[str, torch.Tensor], config: BuiltModel,
                  vocab_size: int) -> Iterator[Tuple[str, torch.Tensor]]:
    """Llama's tensors, each layer's q and k norms after its v_proj weight."""
    for name, tensor in llama.to_hf_tensors(model, config, vocab_size):
        yield name, tensor
        if name.endswith(".self_attn.v_proj.weight"):
            yield from ((theirs, model[ours]) for ours, theirs in head_norms(int(name.split(".")[2])))


def from_hf_state_dict(hf: Mapping[str, torch.Tensor], config: BuiltModel) -> Mapping[str, torch.Tensor]:
    """Qwen3ForCausalLM's weights under GPTModel's names, each converted when asked."""
    take = taker(hf, "Qwen3 model")
    norms = {ours: lambda name=theirs: take(name) for i in range(config.num_layers) for ours, theirs in head_norms(i)}
    return DerivedWeights({**llama.recipes(take, config), **norms})


def hf_config(model: ModelFlags, vocab_size: int, dtype: torch.dtype,
              special_tokens: Optional[Mapping[str, object]] = None) -> dict:
    """config.json of the Qwen3ForCausalLM equal to `model`: Llama's keys (its head size included) without mlp_bias,
    full attention in every layer."""
    config = {key: value for key, value in llama.hf_config(model, vocab_size, dtype, special_tokens).items()
              if key != "mlp_bias"}
    ours = {flag: value for flag, value in config[MODEL_FLAGS_KEY].items() if flag not in QWEN3_FLAGS}
    return {**config, "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, MODEL_FLAGS_KEY: ours,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": qwen2.MAX_WINDOW_LAYERS,
            "layer_types": ["full_attention"] * model.num_layers}


def describe(config: Mapping[str, object]) -> list:
    """What the examiner shows of a Qwen3 config.json beyond its shape."""
    return [*llama.describe(config), f"heads of {config.get('head_dim')} channels, queries and keys RMS-normalised "
                                     "per head"]
