"""The one table of model families: what --model-size offers, what an import recognises and what an export picks
all come from FAMILIES, in this order."""
from typing import Mapping, Optional, Tuple

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


def architectures() -> Tuple[str, ...]:
    """The transformers classes of the families, in FAMILIES' order."""
    return tuple(family.adapter.ARCHITECTURE for family in FAMILIES)


def family_of_model(model: ModelFlags, source: str, architecture: Optional[str] = None) -> Family:
    """The family whose transformers class is `architecture` (the one a checkpoint was imported from) when it holds
    `model`, else the first that holds it, or an InputError naming its variants. Several classes can hold the same
    model (a windowless Mistral is also a Llama), and a round trip should give back the class it took in."""
    holding = [family for family in FAMILIES if family.adapter.holds(model)]
    for family in holding:
        if family.adapter.ARCHITECTURE == architecture:
            return family
    if holding:
        return holding[0]
    names = ", ".join(architectures())
    raise InputError(f"--to-hf: {source} holds a model with {', '.join(model.variants())}, which none of "
                     f"transformers' {names} can hold ({'; '.join(family.needs for family in FAMILIES)})")


def family_asked_for(model: ModelFlags, source: str, architecture: str, default: Family) -> Family:
    """The family of the transformers class a user names (--hf-architecture), or an InputError if that class cannot
    hold `model` (`default`: what an export writes without the flag)."""
    family = next((family for family in FAMILIES if family.adapter.ARCHITECTURE == architecture), None)
    if family is None:
        raise InputError(f"--hf-architecture {architecture!r} is not one of {', '.join(architectures())}")
    if not family.adapter.holds(model):
        raise InputError(f"--hf-architecture {architecture}: {source} holds a model with "
                         f"{', '.join(model.variants()) or 'no architecture variant'}, which that class cannot hold "
                         f"({family.needs}); leave the flag out to write {default.adapter.ARCHITECTURE}")
    return family
