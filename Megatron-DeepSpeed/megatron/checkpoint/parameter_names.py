"""Parameter names across layouts: GPTModel's ('embedding.x', 'layers.N.y', 'final_layernorm.z', an untied head's
'lm_head.weight'), the pipeline's
spec positions and engine names (upstream's numbering, model/pipe.py), upstream's nested module dicts, and the
names earlier versions of this project wrote."""
from typing import Dict, Mapping, Tuple

import torch

from megatron.checkpoint.file_names import EMBEDDING, ENCODER, LANGUAGE_MODEL, OLD_ATTENTION, OUTPUT_LAYER
from megatron.config.model_config import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config
from megatron.model.pipe import EMBEDDING_SPEC, TIED_EMBEDDING, final_norm_spec, layer_spec, output_layer_spec

EMBEDDING_PREFIX = "embedding."
LAYERS_PREFIX = "layers."
FINAL_NORM_PREFIX = "final_layernorm."
OUTPUT_LAYER_WEIGHT = "lm_head.weight"  # an untied head's; the pipeline's OutputLayerPipe keeps the same key
WORD_EMBEDDINGS = EMBEDDING_PREFIX + "word_embeddings.weight"
VOCABULARY_ROWS = (WORD_EMBEDDINGS, OUTPUT_LAYER_WEIGHT)  # a row per (padded) vocabulary entry
TIED_PREFIX = f"tied_modules.{TIED_EMBEDDING}."
OLD_TIED_PREFIX = "tied_modules.embedding."


def spec_position(name: str, num_layers: int) -> Tuple[int, str]:
    """(pipeline spec position, key inside that piece's file) of GPTModel parameter `name`."""
    if name.startswith(EMBEDDING_PREFIX):
        return EMBEDDING_SPEC, name[len(EMBEDDING_PREFIX):]
    if name.startswith(LAYERS_PREFIX):
        _, number, rest = name.split(".", 2)
        return layer_spec(int(number)), rest
    if name == OUTPUT_LAYER_WEIGHT:
        return output_layer_spec(num_layers), name
    return final_norm_spec(num_layers), name[len(FINAL_NORM_PREFIX):]


def positions_with_parameters(num_layers: int, untied: bool = False) -> list:
    """The spec positions whose files hold parameters (`untied`: the output layer's too)."""
    return [EMBEDDING_SPEC, *(layer_spec(i) for i in range(num_layers)), final_norm_spec(num_layers),
            *([output_layer_spec(num_layers)] if untied else [])]


def name_at_position(position: int, key: str, num_layers: int) -> str:
    """GPTModel's name of `key` in the file of spec position `position` (the inverse of spec_position)."""
    if position == EMBEDDING_SPEC:
        return EMBEDDING_PREFIX + key
    if position == final_norm_spec(num_layers):
        return FINAL_NORM_PREFIX + key
    if position == output_layer_spec(num_layers):
        return key
    return f"{LAYERS_PREFIX}{position - layer_spec(0)}.{key}"


def stage_name(name: str, num_layers: int) -> str:
    """The pipeline engine's name of GPTModel parameter `name` ('embedding.x' -> 'tied_modules.embed.x',
    'layers.1.y' -> '4.y', 'final_layernorm.weight' -> '<L+4>.weight')."""
    if name.startswith(EMBEDDING_PREFIX):
        return TIED_PREFIX + name[len(EMBEDDING_PREFIX):]
    position, key = spec_position(name, num_layers)
    return f"{position}.{key}"


def model_name(engine_name: str, num_layers: int, old: bool = False) -> str:
    """GPTModel's name of a pipeline engine's parameter (the inverse of stage_name); plain-engine names are
    GPTModel's already. `old`: as an earlier version of this project named it."""
    for prefix in (TIED_PREFIX, OLD_TIED_PREFIX):
        if engine_name.startswith(prefix):
            return EMBEDDING_PREFIX + engine_name[len(prefix):]
    position, _, key = engine_name.partition(".")
    if not position.isdigit():
        return current_name(engine_name)
    return (old_position_name if old else name_at_position)(int(position), key, num_layers)


def current_name(name: str) -> str:
    """Today's name of a parameter an earlier version of this project wrote."""
    return name.replace(OLD_ATTENTION, ".self_attention.")


def old_position_name(position: int, key: str, num_layers: int) -> str:
    """GPTModel's name of `key` in a layer file that an earlier version wrote (embedding 00, layers 01..L, the
    final LayerNorm L+1 with keys final_layernorm.*)."""
    if position == 0:
        return EMBEDDING_PREFIX + key
    if position <= num_layers:
        return current_name(f"{LAYERS_PREFIX}{position - 1}.{key}")
    return key


# ----------------------------------------------------------------------------- upstream's nesting

def nest(model: Mapping[str, torch.Tensor]) -> dict:
    """GPTModel's state dict as upstream's GPTModel.state_dict_for_save_checkpoint nests it: language_model ->
    embedding -> word_embeddings / position_embeddings -> {weight}; language_model -> encoder -> flat
    'layers.N.*' and 'final_layernorm.*' keys; an untied head at language_model -> output_layer -> {weight}.
    Only the parts present in `model` appear."""
    embedding: Dict[str, dict] = {}
    encoder: Dict[str, torch.Tensor] = {}
    language_model = {}
    for name, tensor in model.items():
        if name == OUTPUT_LAYER_WEIGHT:
            language_model[OUTPUT_LAYER] = {"weight": tensor}
        elif name.startswith(EMBEDDING_PREFIX):
            module, key = name[len(EMBEDDING_PREFIX):].split(".", 1)
            embedding.setdefault(module, {})[key] = tensor
        else:
            encoder[name] = tensor
    if embedding:
        language_model[EMBEDDING] = embedding
    if encoder:
        language_model[ENCODER] = encoder
    return {LANGUAGE_MODEL: language_model}


def flatten(nested: Mapping[str, object]) -> Dict[str, torch.Tensor]:
    """GPTModel's names from upstream's nested dict (the inverse of nest). The last pipeline stage's
    word_embeddings_for_head, a copy of the tied weight, is left out: the embedding's is the one kept."""
    language_model = nested[LANGUAGE_MODEL]
    flat = {}
    for module, tensors in language_model.get(EMBEDDING, {}).items():
        for key, tensor in tensors.items():
            flat[f"{EMBEDDING_PREFIX}{module}.{key}"] = tensor
    for name, tensor in language_model.get(ENCODER, {}).items():
        flat[current_name(name)] = tensor
    if OUTPUT_LAYER in language_model:
        flat[OUTPUT_LAYER_WEIGHT] = language_model[OUTPUT_LAYER]["weight"]
    return flat


# DeepSpeed names an expert file's keys by the MoE layer's module path in the engine's module: `layers.N.mlp` in
# our GPTModel, `language_model.encoder.layers.N.mlp` in upstream's, whose trainer loads only its own.
UPSTREAM_LAYERS_PATH = f"{LANGUAGE_MODEL}.{ENCODER}."


def upstream_expert_key(name: str) -> str:
    """The key of GPTModel parameter `name` in an expert file as upstream's trainer loads it (the converter writes
    these; every reader here takes both)."""
    return UPSTREAM_LAYERS_PATH + name


def expert_model_name(key: str) -> str:
    """GPTModel's name of a key in an expert file, ours or upstream's (the inverse of upstream_expert_key)."""
    return key.removeprefix(UPSTREAM_LAYERS_PATH)


def is_nested(module: Mapping[str, object]) -> bool:
    return LANGUAGE_MODEL in module


def parameter_names(model: ModelConfig) -> list:
    """GPTModel's parameter names for the model `model` describes (built on the meta device: nothing is
    allocated), so each architecture variant's are its own."""
    with torch.device("meta"):
        return [name for name, _ in GPTModel(gpt_config(model, padded_vocab_size=1)).named_parameters()]
