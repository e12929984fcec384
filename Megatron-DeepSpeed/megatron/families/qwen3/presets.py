"""Qwen3's --model-size presets: the published shapes of Qwen3-0.6B (heads of 128 channels at hidden 1024, tied
output layer) and Qwen3-8B (untied), per-head q/k RMSNorm, rotary base 1e6, trained here at a 4096-token context
with Llama 2's AdamW schedule; qwen3-tiny: the tiny CPU layout (TP2 x PP2 x DP2) with 2 key/value heads of 32
channels at hidden 64 (not 64 / 4) and a tied output layer."""
from typing import Optional

from megatron.families.family import Preset
from megatron.families.qwen3.hf_adapter import QWEN3_FLAGS


def qwen3(ffn: int, kv_heads: int, tied: bool, kv_channels: Optional[int], rope_theta: int = 1000000) -> dict:
    """A Qwen3 preset's model flags beyond the shape."""
    return {**QWEN3_FLAGS, "rope_theta": rope_theta, "ffn_hidden_size": ffn, "num_key_value_heads": kv_heads,
            "kv_channels": kv_channels, "untie_embeddings_and_output_weights": not tied}


PRESETS = (
    #      name               TP PP layers hidden heads  seq  mbs gbs  lr      min lr
    Preset("qwen3-0.6B",       1, 1, 28,    1024,  16,   4096, 4,  64, 3e-4,   3e-5,
           model_flags=qwen3(3072, 8, tied=True, kv_channels=128)),
    Preset("qwen3-8B",         2, 2, 36,    4096,  32,   4096, 1,  32, 3e-4,   3e-5,
           model_flags=qwen3(12288, 8, tied=False, kv_channels=None)),
    Preset("qwen3-tiny",       2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
           full_run_iters=300, lr_decay_iters=300, model_flags=qwen3(128, 2, tied=True, kv_channels=32,
                                                                     rope_theta=10000)),
)
