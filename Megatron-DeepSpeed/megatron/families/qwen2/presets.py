"""Qwen2.5's --model-size presets: the published shapes of Qwen2.5-0.5B (tied output layer) and Qwen2.5-7B
(untied), rotary base 1e6, trained here at a 4096-token context with Llama 2's AdamW schedule; qwen2-tiny: the
tiny CPU layout (TP2 x PP2 x DP2) with 2 key/value heads and a tied output layer."""
from megatron.families.family import Preset
from megatron.families.qwen2.hf_adapter import QWEN2_FLAGS


def qwen2(ffn: int, kv_heads: int, tied: bool, rope_theta: int = 1000000) -> dict:
    """A Qwen2 preset's model flags beyond the shape."""
    return {**QWEN2_FLAGS, "rope_theta": rope_theta, "ffn_hidden_size": ffn, "num_key_value_heads": kv_heads,
            "untie_embeddings_and_output_weights": not tied}


PRESETS = (
    #      name               TP PP layers hidden heads  seq  mbs gbs  lr      min lr
    Preset("qwen2.5-0.5B",     1, 1, 24,    896,   14,   4096, 4,  64, 3e-4,   3e-5,
           model_flags=qwen2(4864, 2, tied=True)),
    Preset("qwen2.5-7B",       2, 2, 28,    3584,  28,   4096, 1,  32, 3e-4,   3e-5,
           model_flags=qwen2(18944, 4, tied=False)),
    Preset("qwen2-tiny",       2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
           full_run_iters=300, lr_decay_iters=300, model_flags=qwen2(128, 2, tied=True, rope_theta=10000)),
)
