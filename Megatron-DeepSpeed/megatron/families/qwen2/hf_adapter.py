"""The Hugging Face adapter of Qwen2 / Qwen2.5: Llama's tensors and config keys (llama/hf_adapter.py) plus biases
on the query, key and value projections, none elsewhere (--add-qkv-bias with --disable-bias-linear), tied or
untied output layer, a large rotary base. Sliding-window attention (use_sliding_window, a 'sliding_attention'
layer) is not computed here, so such a config.json is refused.

    ours                                         transformers Qwen2ForCausalLM
    self_attention.query_key_value.bias  [G, (q_1 .. q_Q, k, v), d]  ->  self_attn.q_proj.bias, k_proj.bias,
                                                                         v_proj.bias (as the weights' rows)
"""
from typing import Iterator, Mapping, Optional, Tuple

import torch

from megatron.errors import InputError
from megatron.families.adapter import BuiltModel, ModelFlags
from megatron.families.hf_tensors import MODEL_FLAGS_KEY, DerivedWeights, taker
from megatron.families.llama import hf_adapter as llama

MODEL_TYPE = "qwen2"
ARCHITECTURE = "Qwen2ForCausalLM"
EMBEDDING = llama.EMBEDDING
ALWAYS_TIED = llama.ALWAYS_TIED
QWEN2_FLAGS = {**llama.LLAMA_FLAGS, "add_qkv_bias": True, "add_bias_linear": False}
SLIDING = "sliding_attention"  # a layer type of Qwen2Config.layer_types
MAX_WINDOW_LAYERS = 28  # Qwen2Config's default; no layer has a window here


def holds(model: ModelFlags) -> bool:
    """Whether Qwen2ForCausalLM can hold `model`: Llama's flags with biases on q, k, v only."""
    return (all(getattr(model, flag) == value for flag, value in QWEN2_FLAGS.items())
            and set(model.variant_names()) <= llama.HELD_VARIANTS | {"add_qkv_bias"})


def check_config(config: Mapping[str, object], path: str) -> None:
    """Raise InputError for Qwen2Config options GPTModel does not compute (sliding-window attention)."""
    layer_types = config.get("layer_types") or []
    if config.get("use_sliding_window") or SLIDING in layer_types:
        raise InputError(f"{path} turns on sliding-window attention (use_sliding_window / layer_types "
                         f"'{SLIDING}'), which is not implemented here; only full attention in every layer can be "
                         "imported")


def model_flags_from_hf(config: Mapping[str, object], source: str) -> dict:
    """The model flags of a Qwen2 config.json (Llama's keys; a key it lacks takes Qwen2Config's default)."""
    check_config(config, source)
    return {**llama.model_flags_from_hf(config, source), **QWEN2_FLAGS}


def qkv_biases(model: Mapping[str, torch.Tensor], config: BuiltModel, layer: int) -> Iterator[Tuple[str, torch.Tensor]]:
    query, key, value = llama.qkv_to_hf(model[f"layers.{layer}.self_attention.query_key_value.bias"],
                                        config.num_key_value_heads, config.head_dim)
    prefix = f"model.layers.{layer}.self_attn."
    yield from ((f"{prefix}q_proj.bias", query), (f"{prefix}k_proj.bias", key), (f"{prefix}v_proj.bias", value))


def to_hf_tensors(model: Mapping[str, torch.Tensor], config: BuiltModel,
                  vocab_size: int) -> Iterator[Tuple[str, torch.Tensor]]:
    """Llama's tensors, each layer's q, k, v biases after its v_proj weight."""
    for name, tensor in llama.to_hf_tensors(model, config, vocab_size):
        yield name, tensor
        if name.endswith(".self_attn.v_proj.weight"):
            yield from qkv_biases(model, config, int(name.split(".")[2]))


def from_hf_state_dict(hf: Mapping[str, torch.Tensor], config: BuiltModel) -> Mapping[str, torch.Tensor]:
    """Qwen2ForCausalLM's weights under GPTModel's names, each converted when asked."""
    take = taker(hf, "Qwen2 model")
    biases = {f"layers.{i}.self_attention.query_key_value.bias": lambda prefix=f"model.layers.{i}.self_attn.":
              llama.qkv_from_hf(take(f"{prefix}q_proj.bias"), take(f"{prefix}k_proj.bias"),
                                take(f"{prefix}v_proj.bias"), config.num_key_value_heads, config.head_dim)
              for i in range(config.num_layers)}
    return DerivedWeights({**llama.recipes(take, config), **biases})


def hf_config(model: ModelFlags, vocab_size: int, dtype: torch.dtype,
              special_tokens: Optional[Mapping[str, object]] = None) -> dict:
    """config.json of the Qwen2ForCausalLM equal to `model`: Llama's keys without its bias switches (Qwen2's are
    fixed), full attention in every layer."""
    config = {key: value for key, value in llama.hf_config(model, vocab_size, dtype, special_tokens).items()
              if key not in ("attention_bias", "mlp_bias")}
    ours = {flag: value for flag, value in config[MODEL_FLAGS_KEY].items() if flag not in QWEN2_FLAGS}
    return {**config, "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, MODEL_FLAGS_KEY: ours,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": MAX_WINDOW_LAYERS,
            "layer_types": ["full_attention"] * model.num_layers}


def describe(config: Mapping[str, object]) -> list:
    """What the examiner shows of a Qwen2 config.json beyond its shape."""
    return [*llama.describe(config), "biases: query, key and value projections only"]
