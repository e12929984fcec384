"""Mistral's --model-size presets: mistral-7B, Mistral-7B-v0.3's published shape (32 layers, hidden 4096, 32
heads in 8 key/value groups, FFN 14336, rotary base 1e6, no sliding window; v0.1's 4096-key window and base 1e4 are
--window-size 4095 --rotary-position-embeddings-theta 10000) trained at 4096 tokens with Llama 2's AdamW
schedule; mistral-tiny: the tiny CPU layout (TP2 x PP2 x DP2) with 2 key/value heads and a window of 32 keys
(--window-size 31) inside its 128-token sequence."""
from typing import Optional

from megatron.families.family import Preset
from megatron.families.mistral.hf_adapter import MISTRAL_FLAGS


def mistral(ffn: int, kv_heads: int, rope_theta: int, window_size: Optional[int]) -> dict:
    """A Mistral preset's model flags beyond the shape (untied output layer, as every Mistral)."""
    return {**MISTRAL_FLAGS, "rope_theta": rope_theta, "ffn_hidden_size": ffn, "num_key_value_heads": kv_heads,
            "untie_embeddings_and_output_weights": True, "window_size": window_size}


PRESETS = (
    #      name               TP PP layers hidden heads  seq  mbs gbs  lr      min lr
    Preset("mistral-7B",       2, 2, 32,    4096,  32,   4096, 1,  32, 3e-4,   3e-5,
           model_flags=mistral(14336, 8, rope_theta=1000000, window_size=None)),
    Preset("mistral-tiny",     2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
           full_run_iters=300, lr_decay_iters=300, model_flags=mistral(128, 2, rope_theta=10000, window_size=31)),
)
