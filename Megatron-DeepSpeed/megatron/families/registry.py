"""The one table of model families: what --model-size offers, what an import recognises and what an export picks
all come from FAMILIES, in this order."""
from typing import Mapping, Tuple

from megatron.errors import InputError
from megatron.families import gpt2, llama, mistral, qwen2, qwen3
from megatron.families.adapter import ModelFlags
from megatron.families.family import Family, Preset

FAMILIES: Tuple[Family, ...] = (gpt2.FAMILY, llama.FAMILY, qwen2.FAMILY, mistral.FAMILY, qwen3.FAMILY)


def presets() -> Tuple[Preset, ...]:
    """Every family's presets, family by family."""
    return tuple(preset for family in FAMILIES for preset in family.presets)


def family_of_hf_config(config: Mapping[str, object], path: str) -> Family:
    """The family of a config.json's model_type (and architectures, when listed)."""
    architectures = config.get("architectures") or []
    for family in FAMILIES:
        adapter = family.adapter
        if config.get("model_type") == adapter.MODEL_TYPE and (not architectures or
                                                               adapter.ARCHITECTURE in architectures):
            return family
    listed = ", ".join(architectures) or "no architectures listed"
    known = ", ".join(f"{family.adapter.MODEL_TYPE} ({family.adapter.ARCHITECTURE})" for family in FAMILIES)
    raise InputError(f"{path} describes a '{config.get('model_type')}' model ({listed}); only {known} can be "
                     "imported")


def family_of_model(model: ModelFlags, source: str) -> Family:
    """The first family whose transformers class holds `model`, or an InputError naming its variants."""
    for family in FAMILIES:
        if family.adapter.holds(model):
            return family
    names = ", ".join(family.adapter.ARCHITECTURE for family in FAMILIES)
    raise InputError(f"--to-hf: {source} holds a model with {', '.join(model.variants())}, which none of "
                     f"transformers' {names} can hold ({'; '.join(family.needs for family in FAMILIES)})")
