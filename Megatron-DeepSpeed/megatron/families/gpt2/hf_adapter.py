"""The Hugging Face adapter of GPT-2: the single-process GPTModel state dict <-> a transformers GPT2LMHeadModel
directory, without importing transformers (the config is written here; files through hf/files.py).

Differences bridged: HF's Conv1D stores weights [in, out] (ours [out, in]); HF's fused c_attn rows
are [all q | all k | all v] where ours are ordered per head (q, k, v of head 0, then head 1 ...); HF has no
padded vocabulary rows; HF's "gelu" is the erf form (ours by default), "gelu_new" the tanh form
(--openai-gelu); the LM head is tied to the word embedding in both. The model flags map to GPT2Config's keys
through HF_KEYS; those it has no key for travel in config.json under MODEL_FLAGS_KEY.
"""
from typing import Iterator, Mapping, Optional, Tuple

import torch

from megatron.errors import InputError
from megatron.families.adapter import BuiltModel, ModelFlags
from megatron.families.hf_tensors import (MODEL_FLAGS_KEY, DerivedWeights, dtype_keys, dtype_name, padded_vocabulary,
                                          taker, unmapped_flags)

MODEL_TYPE = "gpt2"
ARCHITECTURE = "GPT2LMHeadModel"
EMBEDDING = "transformer.wte.weight"
ALWAYS_TIED = True
ERF_GELU, TANH_GELUS = "gelu", ("gelu_new", "gelu_pytorch_tanh")

# GPT2Config's keys for the model flags (megatron/config/model_config.py); the first key of a flag is the one read.
HF_KEYS = (("n_layer", "num_layers"), ("n_embd", "hidden_size"), ("n_head", "num_attention_heads"),
           ("n_positions", "max_position_embeddings"), ("n_inner", "ffn_hidden_size"),
           ("layer_norm_epsilon", "layernorm_epsilon"), ("initializer_range", "init_method_std"),
           ("resid_pdrop", "hidden_dropout"), ("embd_pdrop", "hidden_dropout"), ("attn_pdrop", "attention_dropout"))
ACTIVATION_KEY = "activation_function"  # <-> openai_gelu
_MAPPED_FLAGS = frozenset(flag for _, flag in HF_KEYS) | {"openai_gelu"}

_LAYER_NORMS = (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm"))
_LINEARS = (("attn.c_attn", "self_attention.query_key_value"), ("attn.c_proj", "self_attention.dense"),
            ("mlp.c_fc", "mlp.dense_h_to_4h"), ("mlp.c_proj", "mlp.dense_4h_to_h"))
# Options of GPT2Config that change the computation in ways GPTModel does not have.
_UNSUPPORTED_OPTIONS = (("scale_attn_by_inverse_layer_idx", False), ("reorder_and_upcast_attn", False),
                        ("scale_attn_weights", True), ("add_cross_attention", False))


def holds(model: ModelFlags) -> bool:
    """Whether GPT2LMHeadModel can hold `model`: a GPT-2-shaped one, no architecture variant."""
    return not model.variants()


def per_head_qkv_to_hf(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Our fused QKV rows, ordered [heads, (q, k, v), head_dim], in HF's order [(q, k, v), heads, head_dim]."""
    by_head = tensor.reshape(num_heads, 3, -1, *tensor.shape[1:])
    return by_head.transpose(0, 1).reshape(tensor.shape)


def hf_qkv_to_per_head(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    by_part = tensor.reshape(3, num_heads, -1, *tensor.shape[1:])
    return by_part.transpose(0, 1).reshape(tensor.shape)


def to_hf_tensors(model: Mapping[str, torch.Tensor], config: BuiltModel,
                  vocab_size: int) -> Iterator[Tuple[str, torch.Tensor]]:
    """GPTModel's parameters under GPT2LMHeadModel's names (without the tied lm_head.weight), one at a time in
    model order, the padded vocabulary rows beyond `vocab_size` dropped."""
    heads = config.num_attention_heads
    yield EMBEDDING, model["embedding.word_embeddings.weight"][:vocab_size].contiguous()
    yield "transformer.wpe.weight", model["embedding.position_embeddings.weight"]
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"transformer.h.{i}."
        for hf_name, our_name in _LAYER_NORMS:
            for part in ("weight", "bias"):
                yield f"{theirs}{hf_name}.{part}", model[f"{ours}{our_name}.{part}"]
        for hf_name, our_name in _LINEARS:
            weight, bias = model[f"{ours}{our_name}.weight"], model[f"{ours}{our_name}.bias"]
            if our_name == "self_attention.query_key_value":
                weight, bias = per_head_qkv_to_hf(weight, heads), per_head_qkv_to_hf(bias, heads)
            yield f"{theirs}{hf_name}.weight", weight.t().contiguous()
            yield f"{theirs}{hf_name}.bias", bias.contiguous()
    yield "transformer.ln_f.weight", model["final_layernorm.weight"]
    yield "transformer.ln_f.bias", model["final_layernorm.bias"]


def from_hf_state_dict(hf: Mapping[str, torch.Tensor], config: BuiltModel) -> Mapping[str, torch.Tensor]:
    """GPT2LMHeadModel's (or GPT2Model's) weights under GPTModel's names, each converted when asked, the word
    embedding zero-padded to config.vocab_size rows."""
    take = taker(hf, "GPT-2 model", ("transformer.", ""))
    heads = config.num_attention_heads
    recipes = {"embedding.word_embeddings.weight": lambda: padded_vocabulary(take("wte.weight"), config.vocab_size),
               "embedding.position_embeddings.weight": lambda: take("wpe.weight")}
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"h.{i}."
        for hf_name, our_name in _LAYER_NORMS:
            for part in ("weight", "bias"):
                recipes[f"{ours}{our_name}.{part}"] = lambda name=f"{theirs}{hf_name}.{part}": take(name)
        for hf_name, our_name in _LINEARS:
            fused = our_name == "self_attention.query_key_value"
            recipes[f"{ours}{our_name}.weight"] = lambda name=f"{theirs}{hf_name}.weight", fused=fused: (
                hf_qkv_to_per_head(take(name).t(), heads) if fused else take(name).t())
            recipes[f"{ours}{our_name}.bias"] = lambda name=f"{theirs}{hf_name}.bias", fused=fused: (
                hf_qkv_to_per_head(take(name), heads) if fused else take(name))
    recipes["final_layernorm.weight"], recipes["final_layernorm.bias"] = (lambda: take("ln_f.weight"),
                                                                          lambda: take("ln_f.bias"))
    return DerivedWeights(recipes)


def hf_config(model: ModelFlags, vocab_size: int, dtype: torch.dtype,
              special_tokens: Optional[Mapping[str, object]] = None) -> dict:
    """config.json of the GPT2LMHeadModel equal to `model` (transformers reads these keys); the model flags
    GPT2Config has no key for go along under MODEL_FLAGS_KEY, so an import gives back the same model.
    `special_tokens`: bos/eos/pad ids (default: the last vocabulary entry, GPT-2's <|endoftext|>)."""
    eod = vocab_size - 1
    flags = model.to_flags()
    mapped = {key: flags[flag] for key, flag in HF_KEYS}
    unmapped = {flag: value for flag, value in flags.items() if flag not in _MAPPED_FLAGS}
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": vocab_size, **mapped,
            ACTIVATION_KEY: TANH_GELUS[0] if model.openai_gelu else ERF_GELU, MODEL_FLAGS_KEY: unmapped,
            "bos_token_id": eod, "eos_token_id": eod, **(special_tokens or {}), "tie_word_embeddings": True,
            "use_cache": True, **dtype_keys(dtype_name(dtype))}


def check_config(config: Mapping[str, object], path: str) -> None:
    """Raise InputError for GPT2Config options GPTModel does not compute."""
    for option, supported in _UNSUPPORTED_OPTIONS:
        if config.get(option, supported) != supported:
            raise InputError(f"{path} sets {option}={config[option]}, which the Megatron GPT model does not "
                             f"implement; only {option}={supported} can be imported")
    activation = config.get(ACTIVATION_KEY, TANH_GELUS[0])
    if activation not in (ERF_GELU, *TANH_GELUS):
        raise InputError(f"{path} sets {ACTIVATION_KEY} '{activation}'; only '{ERF_GELU}' (erf GeLU) and "
                         f"{' / '.join(TANH_GELUS)} (tanh GeLU, --openai-gelu) can be imported")


def model_flags_from_hf(config: Mapping[str, object], source: str) -> dict:
    """The model flags of a GPT-2 config.json. The shape keys must be there; another key it lacks takes upstream's
    default, which is GPT2Config's too, except the activation: transformers' default is the tanh form."""
    check_config(config, source)
    standard = {}
    for key, flag in HF_KEYS:
        if config.get(key) is not None:
            standard.setdefault(flag, config[key])
    activation = config.get(ACTIVATION_KEY, TANH_GELUS[0])
    return {**unmapped_flags(config, source), **standard, "openai_gelu": activation in TANH_GELUS}


def describe(config: Mapping[str, object]) -> list:
    """What the examiner shows of a GPT-2 config.json beyond its shape."""
    return [f"activation: {config.get(ACTIVATION_KEY)}"]
