"""Mistral: Llama's architecture with sliding-window attention (none in v0.3)."""
from megatron.families.family import Family
from megatron.families.mistral import hf_adapter
from megatron.families.mistral.presets import PRESETS

FAMILY = Family("mistral", hf_adapter, presets=PRESETS,
                needs="Mistral needs Llama's flags with --disable-bias-linear, and --window-size for its sliding "
                      "window")
