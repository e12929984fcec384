"""The single-process GPTModel state dict <-> a Hugging Face transformers GPT2LMHeadModel directory
(config.json + model.safetensors), without importing transformers: the config is written here.

Differences bridged (DESIGN §9): HF's Conv1D stores weights [in, out] (ours [out, in]); HF's fused c_attn rows
are [all q | all k | all v] where ours are ordered per head (q, k, v of head 0, then head 1 ...); HF has no
padded vocabulary rows; HF's "gelu" is the erf form (ours by default), "gelu_new" the tanh form
(--openai-gelu); the LM head is tied to the word embedding in both. The model flags map to GPT2Config's keys
through HF_KEYS; those it has no key for travel in config.json under MODEL_FLAGS_KEY, which transformers keeps
as an attribute and otherwise ignores.
"""
import json
import os
from typing import Dict, Mapping, Optional

import torch

from megatron.config.model_config import ModelConfig
from megatron.errors import InputError
from megatron.model.gpt import GPTConfig, GPTModel

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LEGACY_WEIGHTS_FILE = "pytorch_model.bin"
ARCHITECTURE = "GPT2LMHeadModel"
ERF_GELU, TANH_GELUS = "gelu", ("gelu_new", "gelu_pytorch_tanh")
MAX_VOCAB_SIZE = 1 << 31  # token ids are stored as int32 at most (data/indexed_dataset.py)

# GPT2Config's keys for the model flags (megatron/config/model_config.py); the first key of a flag is the one read.
HF_KEYS = (("n_layer", "num_layers"), ("n_embd", "hidden_size"), ("n_head", "num_attention_heads"),
           ("n_positions", "max_position_embeddings"), ("n_inner", "ffn_hidden_size"),
           ("layer_norm_epsilon", "layernorm_epsilon"), ("initializer_range", "init_method_std"),
           ("resid_pdrop", "hidden_dropout"), ("embd_pdrop", "hidden_dropout"), ("attn_pdrop", "attention_dropout"))
ACTIVATION_KEY = "activation_function"  # <-> openai_gelu
_MAPPED_FLAGS = frozenset(flag for _, flag in HF_KEYS) | {"openai_gelu"}
MODEL_FLAGS_KEY = "megatron_model_flags"  # our key: the model flags GPT2Config has none for

_LAYER_NORMS = (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm"))
_LINEARS = (("attn.c_attn", "self_attention.query_key_value"), ("attn.c_proj", "self_attention.dense"),
            ("mlp.c_fc", "mlp.dense_h_to_4h"), ("mlp.c_proj", "mlp.dense_4h_to_h"))
# Options of GPT2Config that change the computation in ways GPTModel does not have.
_UNSUPPORTED_OPTIONS = (("scale_attn_by_inverse_layer_idx", False), ("reorder_and_upcast_attn", False),
                        ("scale_attn_weights", True), ("add_cross_attention", False))


def per_head_qkv_to_hf(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Our fused QKV rows, ordered [heads, (q, k, v), head_dim], in HF's order [(q, k, v), heads, head_dim]."""
    by_head = tensor.reshape(num_heads, 3, -1, *tensor.shape[1:])
    return by_head.transpose(0, 1).reshape(tensor.shape)


def hf_qkv_to_per_head(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    by_part = tensor.reshape(3, num_heads, -1, *tensor.shape[1:])
    return by_part.transpose(0, 1).reshape(tensor.shape)


def to_hf_state_dict(model: Mapping[str, torch.Tensor], config: GPTConfig, vocab_size: int) -> Dict[str, torch.Tensor]:
    """GPTModel's parameters under GPT2LMHeadModel's names (without the tied lm_head.weight), the padded
    vocabulary rows beyond `vocab_size` dropped."""
    heads = config.num_attention_heads
    hf = {"transformer.wte.weight": model["embedding.word_embeddings.weight"][:vocab_size],
          "transformer.wpe.weight": model["embedding.position_embeddings.weight"],
          "transformer.ln_f.weight": model["final_layernorm.weight"],
          "transformer.ln_f.bias": model["final_layernorm.bias"]}
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"transformer.h.{i}."
        for hf_name, our_name in _LAYER_NORMS:
            for part in ("weight", "bias"):
                hf[f"{theirs}{hf_name}.{part}"] = model[f"{ours}{our_name}.{part}"]
        for hf_name, our_name in _LINEARS:
            weight, bias = model[f"{ours}{our_name}.weight"], model[f"{ours}{our_name}.bias"]
            if our_name == "self_attention.query_key_value":
                weight, bias = per_head_qkv_to_hf(weight, heads), per_head_qkv_to_hf(bias, heads)
            hf[f"{theirs}{hf_name}.weight"] = weight.t()
            hf[f"{theirs}{hf_name}.bias"] = bias
    return {name: tensor.contiguous() for name, tensor in hf.items()}


def from_hf_state_dict(hf: Mapping[str, torch.Tensor], config: GPTConfig, vocab_size: int) -> Dict[str, torch.Tensor]:
    """GPT2LMHeadModel's (or GPT2Model's) weights under GPTModel's names, the word embedding (`vocab_size` rows,
    config.json's) zero-padded to config.vocab_size rows. Every tensor must have the shape config.json gives it."""
    hf = {name.removeprefix("transformer."): tensor for name, tensor in hf.items()}
    heads = config.num_attention_heads
    with torch.device("meta"):  # shapes only: nothing is allocated
        expected = {name: tuple(tensor.shape) for name, tensor in GPTModel(config).state_dict().items()}
    expected["embedding.word_embeddings.weight"] = (vocab_size, config.hidden_size)

    def take(name: str, ours: str, transposed: bool = False) -> torch.Tensor:
        if name not in hf:
            raise InputError(f"the Hugging Face weights have no tensor '{name}' (nor 'transformer.{name}'); they do "
                             "not belong to a GPT-2 model of this config.json")
        shape = expected[ours][::-1] if transposed else expected[ours]
        if tuple(hf[name].shape) != shape:
            raise InputError(f"the Hugging Face tensor '{name}' has shape {list(hf[name].shape)}, but {CONFIG_FILE} "
                             f"describes {list(shape)}: the weights and {CONFIG_FILE} belong to different models; "
                             f"use the config.json saved with these weights")
        return hf[name]

    wte = take("wte.weight", "embedding.word_embeddings.weight")
    if wte.shape[0] > config.vocab_size:
        raise InputError(f"the Hugging Face vocabulary has {wte.shape[0]} rows, more than the padded size "
                         f"{config.vocab_size}")
    padded = torch.zeros(config.vocab_size, wte.shape[1], dtype=wte.dtype)
    padded[:wte.shape[0]] = wte
    model = {"embedding.word_embeddings.weight": padded,
             "embedding.position_embeddings.weight": take("wpe.weight", "embedding.position_embeddings.weight")}
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"h.{i}."
        for hf_name, our_name in _LAYER_NORMS:
            for part in ("weight", "bias"):
                model[f"{ours}{our_name}.{part}"] = take(f"{theirs}{hf_name}.{part}", f"{ours}{our_name}.{part}")
        for hf_name, our_name in _LINEARS:
            weight = take(f"{theirs}{hf_name}.weight", f"{ours}{our_name}.weight", transposed=True).t()
            bias = take(f"{theirs}{hf_name}.bias", f"{ours}{our_name}.bias")
            if our_name == "self_attention.query_key_value":
                weight, bias = hf_qkv_to_per_head(weight, heads), hf_qkv_to_per_head(bias, heads)
            model[f"{ours}{our_name}.weight"] = weight
            model[f"{ours}{our_name}.bias"] = bias
    for part in ("weight", "bias"):
        model[f"final_layernorm.{part}"] = take(f"ln_f.{part}", f"final_layernorm.{part}")
    return {name: tensor.contiguous() for name, tensor in model.items()}


def hf_config(model: ModelConfig, vocab_size: int, dtype: torch.dtype, eod: Optional[int] = None) -> dict:
    """config.json of the GPT2LMHeadModel equal to `model` (transformers reads these keys); the model flags
    GPT2Config has no key for go along under MODEL_FLAGS_KEY, so an import gives back the same model."""
    eod = vocab_size - 1 if eod is None else eod
    flags = model.to_flags()
    mapped = {key: flags[flag] for key, flag in HF_KEYS}
    unmapped = {flag: value for flag, value in flags.items() if flag not in _MAPPED_FLAGS}
    return {"architectures": [ARCHITECTURE], "model_type": "gpt2", "vocab_size": vocab_size, **mapped,
            ACTIVATION_KEY: TANH_GELUS[0] if model.openai_gelu else ERF_GELU, MODEL_FLAGS_KEY: unmapped,
            "bos_token_id": eod, "eos_token_id": eod, "tie_word_embeddings": True, "use_cache": True,
            "torch_dtype": str(dtype).removeprefix("torch.")}


def model_config_from_hf(config: Mapping[str, object], source: str = CONFIG_FILE) -> ModelConfig:
    """The model of a GPT-2 config.json (checked by read_hf_config). The shape keys must be there; another key
    it lacks takes upstream's default, which is GPT2Config's too, except the activation: transformers' default
    is the tanh form."""
    ours = config.get(MODEL_FLAGS_KEY) or {}
    if not isinstance(ours, dict):
        raise InputError(f"{source} sets {MODEL_FLAGS_KEY} to {ours!r}; it must map flag names to values "
                         "(or be removed)")
    standard = {}
    for key, flag in HF_KEYS:
        if config.get(key) is not None:
            standard.setdefault(flag, config[key])
    vocab_size = config.get("vocab_size")
    if type(vocab_size) is not int or not 0 < vocab_size <= MAX_VOCAB_SIZE:
        raise InputError(f"{path} sets vocab_size={json.dumps(vocab_size)}; it must be the whole number of rows of "
                         f"the model's word embedding (at most {MAX_VOCAB_SIZE}): fix {CONFIG_FILE}")
    activation = config.get(ACTIVATION_KEY, TANH_GELUS[0])
    return ModelConfig.from_flags({**ours, **standard, "openai_gelu": activation in TANH_GELUS}, source)


def read_hf_config(directory: str) -> dict:
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isdir(directory):
        raise InputError(f"Hugging Face model directory {directory} does not exist")
    if not os.path.isfile(path):
        raise InputError(f"{directory} has no {CONFIG_FILE}: it is not a Hugging Face model directory")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as err:
        raise InputError(f"{path} cannot be read as JSON ({err})") from err
    architectures = config.get("architectures") or []
    if config.get("model_type") != "gpt2" or (architectures and ARCHITECTURE not in architectures):
        listed = ", ".join(architectures) or "no architectures listed"
        raise InputError(f"{path} describes a '{config.get('model_type')}' model ({listed}); only GPT-2 "
                         f"({ARCHITECTURE}) can be imported")
    for option, supported in _UNSUPPORTED_OPTIONS:
        if config.get(option, supported) != supported:
            raise InputError(f"{path} sets {option}={config[option]}, which the Megatron GPT model does not "
                             f"implement; only {option}={supported} can be imported")
    vocab_size = config.get("vocab_size")
    if type(vocab_size) is not int or not 0 < vocab_size <= MAX_VOCAB_SIZE:
        raise InputError(f"{path} sets vocab_size={json.dumps(vocab_size)}; it must be the whole number of rows of "
                         f"the model's word embedding (at most {MAX_VOCAB_SIZE}): fix {CONFIG_FILE}")
    activation = config.get(ACTIVATION_KEY, TANH_GELUS[0])
    if activation not in (ERF_GELU, *TANH_GELUS):
        raise InputError(f"{path} sets {ACTIVATION_KEY} '{activation}'; only '{ERF_GELU}' (erf GeLU) and "
                         f"{' / '.join(TANH_GELUS)} (tanh GeLU, --openai-gelu) can be imported")
    return config


def read_hf_weights(directory: str) -> Dict[str, torch.Tensor]:
    """The tensors of model.safetensors (or the older pytorch_model.bin) in `directory`."""
    safetensors_path = os.path.join(directory, WEIGHTS_FILE)
    legacy_path = os.path.join(directory, LEGACY_WEIGHTS_FILE)
    try:
        if os.path.isfile(safetensors_path):
            from safetensors.torch import load_file as load_safetensors
            return load_safetensors(safetensors_path)
        if os.path.isfile(legacy_path):
            return torch.load(legacy_path, map_location="cpu", weights_only=True)
    except Exception as err:  # safetensors and torch raise their own types for damaged files
        raise InputError(f"the weights in {directory} cannot be read ({type(err).__name__}: {err}); the file is "
                         "truncated or damaged") from err
    raise InputError(f"{directory} has neither {WEIGHTS_FILE} nor {LEGACY_WEIGHTS_FILE}; only single-file GPT-2 "
                     "weights can be imported")


def write_hf_directory(directory: str, weights: Mapping[str, torch.Tensor], config: dict) -> None:
    """config.json + model.safetensors into an existing (temporary) directory."""
    from safetensors.torch import save_file

    with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
        handle.write("\n")
    save_file(dict(weights), os.path.join(directory, WEIGHTS_FILE), metadata={"format": "pt"})
