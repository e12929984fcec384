"""Llama: RMSNorm, rotary positions, SwiGLU, grouped-query attention (docs/llama.md)."""
from megatron.families.family import Family
from megatron.families.llama import hf_adapter
from megatron.families.llama.presets import PRESETS

FAMILY = Family("llama", hf_adapter, presets=PRESETS,
                needs="Llama needs --normalization rmsnorm, --use-rotary-position-embeddings at --rotary-percent 1, "
                      "--swiglu and no position embedding")
