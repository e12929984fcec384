"""Llama's --model-size presets: the published shapes (Llama 2 7B / 13B, Llama 3 8B, TinyLlama 1.1B: layers,
hidden, heads, key/value heads, FFN width, context, rotary theta) with Llama 2's AdamW schedule peak 3e-4
(TinyLlama's 4e-4) decayed to 10%; layouts sized for one node of 80 GiB devices (the planner's estimate).
llama-tiny: the tiny preset's CPU layout with 2 key/value heads for its 4 query heads, so grouped-query attention
is split over TP 2. Llama 3.1 8B and 3.2 1B / 3B: Llama 3's shape with the llama3 rotary scaling (factor 8, and 32
for 3.2) of their config.json, 3.2 with its tied head; trained at 8192 tokens, the context the scaling starts from.
llama3.1-tiny: llama-tiny so scaled (factor 4 from Llama 3.1's original 8192; the CPU run's 128 tokens stay below
it)."""
from typing import Optional

from megatron.families.family import Preset
from megatron.families.llama.hf_adapter import LLAMA_FLAGS


def llama(ffn: int, kv_heads: int, rope_theta: int = 10000, rope_scaling_factor: Optional[float] = None,
          tied: bool = False) -> dict:
    """A Llama preset's model flags beyond the shape: the family's, no linear biases, an untied output layer unless
    `tied`, Llama 3.1's llama3 rotary scaling where a factor is given, and these sizes."""
    scaling = {} if rope_scaling_factor is None else {"rope_scaling_type": "llama3",
                                                      "rope_scaling_factor": rope_scaling_factor}
    return {**LLAMA_FLAGS, "rope_theta": rope_theta, "ffn_hidden_size": ffn, "num_key_value_heads": kv_heads,
            "add_bias_linear": False, "untie_embeddings_and_output_weights": not tied, **scaling}


PRESETS = (
    #      name               TP PP layers hidden heads  seq  mbs gbs  lr      min lr
    Preset("llama2-7B",        2, 2, 32,    4096,  32,   4096, 1,  32, 3e-4,   3e-5, model_flags=llama(11008, 32)),
    Preset("llama2-13B",       4, 2, 40,    5120,  40,   4096, 1,  32, 3e-4,   3e-5, model_flags=llama(13824, 40)),
    Preset("llama3-8B",        2, 2, 32,    4096,  32,   8192, 1,  32, 3e-4,   3e-5,
           model_flags=llama(14336, 8, rope_theta=500000)),
    Preset("tinyllama-1.1B",   1, 1, 22,    2048,  32,   2048, 8,  64, 4e-4,   4e-5, model_flags=llama(5632, 4)),
    Preset("llama-tiny",       2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
           full_run_iters=300, lr_decay_iters=300, model_flags=llama(128, 2)),
    Preset("llama3.1-8B",      2, 2, 32,    4096,  32,   8192, 1,  32, 3e-4,   3e-5,
           model_flags=llama(14336, 8, rope_theta=500000, rope_scaling_factor=8.0)),
    Preset("llama3.2-1B",      1, 1, 16,    2048,  32,   8192, 2,  64, 3e-4,   3e-5,
           model_flags=llama(8192, 8, rope_theta=500000, rope_scaling_factor=32.0, tied=True)),
    Preset("llama3.2-3B",      2, 1, 28,    3072,  24,   8192, 1,  32, 3e-4,   3e-5,
           model_flags=llama(8192, 8, rope_theta=500000, rope_scaling_factor=32.0, tied=True)),
    Preset("llama3.1-tiny",    2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
           full_run_iters=300, lr_decay_iters=300, model_flags=llama(128, 2, rope_scaling_factor=4.0)),
)
