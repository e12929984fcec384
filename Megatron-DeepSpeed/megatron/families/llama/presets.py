"""Llama's --model-size presets: the published shapes (Llama 2 7B / 13B, Llama 3 8B, TinyLlama 1.1B: layers,
hidden, heads, key/value heads, FFN width, context, rotary theta) with Llama 2's AdamW schedule peak 3e-4
(TinyLlama's 4e-4) decayed to 10%; layouts sized for one node of 80 GiB devices (the planner's estimate).
llama-tiny: the tiny preset's CPU layout with 2 key/value heads for its 4 query heads, so grouped-query attention
is split over TP 2."""
from megatron.families.family import Preset
from megatron.families.llama.hf_adapter import LLAMA_FLAGS


def llama(ffn: int, kv_heads: int, rope_theta: int = 10000) -> dict:
    """A Llama preset's model flags beyond the shape: the family's, no linear biases, an untied output layer, and
    these sizes."""
    return {**LLAMA_FLAGS, "rope_theta": rope_theta, "ffn_hidden_size": ffn, "num_key_value_heads": kv_heads,
            "add_bias_linear": False, "untie_embeddings_and_output_weights": True}


PRESETS = (
    #      name               TP PP layers hidden heads  seq  mbs gbs  lr      min lr
    Preset("llama2-7B",        2, 2, 32,    4096,  32,   4096, 1,  32, 3e-4,   3e-5, model_flags=llama(11008, 32)),
    Preset("llama2-13B",       4, 2, 40,    5120,  40,   4096, 1,  32, 3e-4,   3e-5, model_flags=llama(13824, 40)),
    Preset("llama3-8B",        2, 2, 32,    4096,  32,   8192, 1,  32, 3e-4,   3e-5,
           model_flags=llama(14336, 8, rope_theta=500000)),
    Preset("tinyllama-1.1B",   1, 1, 22,    2048,  32,   2048, 8,  64, 4e-4,   4e-5, model_flags=llama(5632, 4)),
    Preset("llama-tiny",       2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
           full_run_iters=300, lr_decay_iters=300, model_flags=llama(128, 2)),
)
