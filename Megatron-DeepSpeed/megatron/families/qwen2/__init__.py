"""Qwen2 / Qwen2.5: Llama's architecture with biases on the query, key and value projections only."""
from megatron.families.family import Family
from megatron.families.qwen2 import hf_adapter
from megatron.families.qwen2.presets import PRESETS

FAMILY = Family("qwen2", hf_adapter, presets=PRESETS,
                needs="Qwen2 needs Llama's flags with --add-qkv-bias and --disable-bias-linear")
