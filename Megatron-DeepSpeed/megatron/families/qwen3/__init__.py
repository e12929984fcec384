"""Qwen3: Llama's architecture with per-head RMSNorm on queries and keys and a head size of its own."""
from megatron.families.family import Family
from megatron.families.qwen3 import hf_adapter
from megatron.families.qwen3.presets import PRESETS

FAMILY = Family("qwen3", hf_adapter, presets=PRESETS,
                needs="Qwen3 needs Llama's flags with --qk-layernorm and --disable-bias-linear (any --kv-channels)")
