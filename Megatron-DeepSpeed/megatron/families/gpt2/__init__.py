"""GPT-2: learned positions, LayerNorm, GeLU MLP, biases, tied output layer (the model flags' defaults)."""
from megatron.families.family import Family
from megatron.families.gpt2 import hf_adapter
from megatron.families.gpt2.presets import PRESETS

FAMILY = Family("gpt2", hf_adapter, needs="GPT-2 needs every architecture flag at its default", presets=PRESETS)
