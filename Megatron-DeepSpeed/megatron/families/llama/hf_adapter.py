"""The Hugging Face adapter of the Llama family: the single-process GPTModel state dict of a Llama-style model
(RMSNorm, rotary, SwiGLU, grouped-query attention) <-> a transformers LlamaForCausalLM directory.

The one mapping, per layer (G key/value heads, Q = heads / G queries per group, d = head_dim, F = ffn):

    ours                                    rows                              transformers
    self_attention.query_key_value   [G, (q_1 .. q_Q, k, v), d]   ->  self_attn.q_proj [G * Q * d] (group-major),
                                                                       self_attn.k_proj [G * d], v_proj [G * d]
    self_attention.dense                                          ->  self_attn.o_proj
    mlp.dense_h_to_4h                [gate; up] halves            ->  mlp.gate_proj [F], mlp.up_proj [F]
    mlp.dense_4h_to_h                                             ->  mlp.down_proj
    input_layernorm / post_attention_layernorm                   ->  the same names
  and embedding.word_embeddings -> model.embed_tokens, final_layernorm -> model.norm, lm_head -> lm_head (absent
  when tied), the padded vocabulary rows dropped. Biases (attention_bias / mlp_bias, our --add-bias-linear) follow
  their weights' rows.

Query head h of transformers uses key/value head h // Q (its repeat_kv), as ours does, so the q rows keep their
order. No rotary permutation is needed: both rotate channel i with channel i + d/2 (model/rotary.py); the
permutation in transformers' convert_llama_weights_to_hf is from Meta's interleaved pairs, a layout neither has.
Config keys map through HF_KEYS, head_dim through --kv-channels (Mistral Nemo's 128 at hidden 5120); the rotary
base and scaling (default, linear, llama3, yarn) through hf_rope.py, read from rope_parameters (transformers 5.x)
or rope_theta / rope_scaling (4.x) and written in both forms.
"""
from typing import Iterator, Mapping, Optional, Tuple

import torch

from megatron.errors import InputError
from megatron.families.adapter import BuiltModel, ModelFlags
from megatron.families.hf_rope import describe_rope, rope_flags_from_hf, rope_to_hf
from megatron.families.hf_tensors import (MODEL_FLAGS_KEY, DerivedWeights, dtype_keys, dtype_name, padded_vocabulary,
                                          taker, unmapped_flags)
from megatron.families.rope_scaling import ROPE_SCALING_FLAGS

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"
ACTIVATION = "silu"
EMBEDDING = "model.embed_tokens.weight"
ALWAYS_TIED = False

# LlamaConfig's keys for the model flags.
HF_KEYS = (("num_hidden_layers", "num_layers"), ("hidden_size", "hidden_size"),
           ("num_attention_heads", "num_attention_heads"), ("num_key_value_heads", "num_key_value_heads"),
           ("intermediate_size", "ffn_hidden_size"), ("max_position_embeddings", "max_position_embeddings"),
           ("rms_norm_eps", "layernorm_epsilon"), ("initializer_range", "init_method_std"),
           ("attention_dropout", "attention_dropout"))
# The flags a Llama model has by definition (what holds() checks and an import sets).
LLAMA_FLAGS = {"normalization": "rmsnorm", "add_position_embedding": False, "use_rotary_position_embeddings": True,
               "rotary_percent": 1.0, "swiglu": True}
# Set on import unless config.json carries our own: transformers' Llama has no hidden dropout and scales attention
# scores by 1/sqrt(d) only.
IMPORT_FLAGS = {"hidden_dropout": 0.0, "apply_query_key_layer_scaling": False}
_MAPPED_FLAGS = frozenset(flag for _, flag in HF_KEYS) | set(LLAMA_FLAGS) | {
    "rope_theta", *ROPE_SCALING_FLAGS, "add_bias_linear", "untie_embeddings_and_output_weights", "kv_channels"}
_NORMS = ("input_layernorm", "post_attention_layernorm")


# The variant flags LlamaForCausalLM has keys for; a model with any other variant is not Llama's.
HELD_VARIANTS = frozenset(LLAMA_FLAGS) | {"rope_theta", *ROPE_SCALING_FLAGS, "num_key_value_heads",
                                         "add_bias_linear", "untie_embeddings_and_output_weights", "kv_channels"}


def holds(model: ModelFlags) -> bool:
    """Whether LlamaForCausalLM can hold `model`: Llama's flags, and no variant it has no key for."""
    return (all(getattr(model, flag) == value for flag, value in LLAMA_FLAGS.items())
            and set(model.variant_names()) <= HELD_VARIANTS)


def qkv_to_hf(tensor: torch.Tensor, groups: int, head_dim: int) -> Tuple[torch.Tensor, ...]:
    """Our grouped QKV rows [G, (queries, key, value), d] (a weight or a bias) as transformers' q, k, v."""
    grouped = tensor.reshape(groups, -1, head_dim, *tensor.shape[1:])
    rest = tensor.shape[1:]
    return tuple(part.reshape(-1, *rest).clone(memory_format=torch.contiguous_format)
                 for part in (grouped[:, :-2], grouped[:, -2], grouped[:, -1]))


def qkv_from_hf(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, groups: int,
                head_dim: int) -> torch.Tensor:
    rest = query.shape[1:]
    parts = (query.reshape(groups, -1, head_dim, *rest), key.reshape(groups, 1, head_dim, *rest),
             value.reshape(groups, 1, head_dim, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def gate_up_to_hf(tensor: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Our [gate; up] rows (the whole model's: upstream Megatron-DeepSpeed's TP-1 layout) as transformers'
    gate_proj and up_proj."""
    return tuple(half.contiguous() for half in tensor.chunk(2, dim=0))


def gate_up_from_hf(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.cat((gate, up), dim=0)


def _parameters(model_config: BuiltModel) -> Tuple[str, ...]:
    return ("weight", "bias") if model_config.add_bias_linear else ("weight",)


def to_hf_tensors(model: Mapping[str, torch.Tensor], config: BuiltModel,
                  vocab_size: int) -> Iterator[Tuple[str, torch.Tensor]]:
    """GPTModel's parameters under LlamaForCausalLM's names, one layer at a time in model order, the padded
    vocabulary rows beyond `vocab_size` dropped."""
    groups, head_dim = config.num_key_value_heads, config.head_dim
    yield EMBEDDING, model["embedding.word_embeddings.weight"][:vocab_size].contiguous()
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        for norm in _NORMS:
            yield f"{theirs}{norm}.weight", model[f"{ours}{norm}.weight"]
        for part in _parameters(config):
            query, key, value = qkv_to_hf(model[f"{ours}self_attention.query_key_value.{part}"], groups, head_dim)
            yield f"{theirs}self_attn.q_proj.{part}", query
            yield f"{theirs}self_attn.k_proj.{part}", key
            yield f"{theirs}self_attn.v_proj.{part}", value
            yield f"{theirs}self_attn.o_proj.{part}", model[f"{ours}self_attention.dense.{part}"]
            gate, up = gate_up_to_hf(model[f"{ours}mlp.dense_h_to_4h.{part}"])
            yield f"{theirs}mlp.gate_proj.{part}", gate
            yield f"{theirs}mlp.up_proj.{part}", up
            yield f"{theirs}mlp.down_proj.{part}", model[f"{ours}mlp.dense_4h_to_h.{part}"]
    yield "model.norm.weight", model["final_layernorm.weight"]
    if config.untie_embeddings_and_output_weights:
        yield "lm_head.weight", model["lm_head.weight"][:vocab_size].contiguous()


def from_hf_state_dict(hf: Mapping[str, torch.Tensor], config: BuiltModel) -> Mapping[str, torch.Tensor]:
    """LlamaForCausalLM's weights under GPTModel's names, each converted when asked, the vocabulary rows
    zero-padded to config.vocab_size."""
    return DerivedWeights(recipes(taker(hf, "Llama model"), config))


def recipes(take, config: BuiltModel) -> dict:
    """Our name -> how to make it from Llama's tensors, `take(name)` giving one of those (a family whose
    transformers class is Llama's with more tensors adds its own)."""
    groups, head_dim = config.num_key_value_heads, config.head_dim
    made = {"embedding.word_embeddings.weight": lambda: padded_vocabulary(take(EMBEDDING), config.vocab_size)}
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        for norm in _NORMS:
            made[f"{ours}{norm}.weight"] = lambda name=f"{theirs}{norm}.weight": take(name)
        for part in _parameters(config):
            attention, mlp = f"{theirs}self_attn.", f"{theirs}mlp."
            made[f"{ours}self_attention.query_key_value.{part}"] = lambda a=attention, p=part: qkv_from_hf(
                take(f"{a}q_proj.{p}"), take(f"{a}k_proj.{p}"), take(f"{a}v_proj.{p}"), groups, head_dim)
            made[f"{ours}self_attention.dense.{part}"] = lambda name=f"{attention}o_proj.{part}": take(name)
            made[f"{ours}mlp.dense_h_to_4h.{part}"] = lambda m=mlp, p=part: gate_up_from_hf(
                take(f"{m}gate_proj.{p}"), take(f"{m}up_proj.{p}"))
            made[f"{ours}mlp.dense_4h_to_h.{part}"] = lambda name=f"{mlp}down_proj.{part}": take(name)
    made["final_layernorm.weight"] = lambda: take("model.norm.weight")
    if config.untie_embeddings_and_output_weights:
        made["lm_head.weight"] = lambda: padded_vocabulary(take("lm_head.weight"), config.vocab_size)
    return made


def check_config(config: Mapping[str, object], path: str) -> None:
    """Raise InputError for LlamaConfig options GPTModel does not compute."""
    activation = config.get("hidden_act", ACTIVATION)
    if activation != ACTIVATION:
        raise InputError(f"{path} sets hidden_act '{activation}'; only '{ACTIVATION}' (SwiGLU) can be imported")
    if bool(config.get("attention_bias", False)) != bool(config.get("mlp_bias", False)):
        raise InputError(f"{path} sets attention_bias={config.get('attention_bias')} but mlp_bias="
                         f"{config.get('mlp_bias')}; --add-bias-linear covers both, so they must agree")


def kv_channels_from_hf(config: Mapping[str, object]) -> Optional[int]:
    """--kv-channels of config.json's head_dim: None where it is hidden_size / num_attention_heads (or absent)."""
    head_dim = config.get("head_dim")
    if head_dim is None or head_dim * config.get("num_attention_heads", 0) == config.get("hidden_size"):
        return None
    return head_dim


def model_flags_from_hf(config: Mapping[str, object], source: str) -> dict:
    """The model flags of a Llama config.json; a key it lacks takes LlamaConfig's default."""
    check_config(config, source)
    standard = {flag: config[key] for key, flag in HF_KEYS if config.get(key) is not None}
    return {**IMPORT_FLAGS, **unmapped_flags(config, source), **standard, **LLAMA_FLAGS,
            **rope_flags_from_hf(config, source),
            "add_bias_linear": bool(config.get("attention_bias", False)), "kv_channels": kv_channels_from_hf(config),
            "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", False)}


def hf_config(model: ModelFlags, vocab_size: int, dtype: torch.dtype,
              special_tokens: Optional[Mapping[str, object]] = None) -> dict:
    """config.json of the LlamaForCausalLM equal to `model`, readable by transformers 4.x and 5.x; the flags
    LlamaConfig has no key for go along under MODEL_FLAGS_KEY. `special_tokens`: bos/eos/pad ids."""
    flags = model.to_flags()
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": vocab_size,
            **{key: flags[flag] for key, flag in HF_KEYS},
            "head_dim": model.kv_channels or model.hidden_size // model.num_attention_heads,
            "hidden_act": ACTIVATION, "attention_bias": model.add_bias_linear, "mlp_bias": model.add_bias_linear,
            "tie_word_embeddings": not model.untie_embeddings_and_output_weights,
            **rope_to_hf(model),
            MODEL_FLAGS_KEY: {flag: value for flag, value in flags.items() if flag not in _MAPPED_FLAGS},
            **(special_tokens or {}), "use_cache": True, **dtype_keys(dtype_name(dtype))}


def describe(config: Mapping[str, object]) -> list:
    """What the examiner shows of a Llama config.json beyond its shape."""
    heads = config.get("num_attention_heads")
    groups = config.get("num_key_value_heads") or heads
    return [f"attention: {heads} query heads in {groups} key/value groups",
            describe_rope(config),
            f"output layer: {'tied to' if config.get('tie_word_embeddings') else 'untied from'} the word embedding"]
