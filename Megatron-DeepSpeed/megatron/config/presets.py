"""Model-size presets: the single source of truth for the numbers in docs/ARCHITECTURE.md, Presets.

`--model-size NAME` and the shell entry points both read this table, so a size is changed in one
place. A preset maps argparse attribute names (Megatron flags, dashes as underscores) to values.

    python -m megatron.config.presets 345M                  # KEY=VALUE lines for `eval` in bash
    python -m megatron.config.presets 345M --format flags   # Megatron flags, one per line
    python -m megatron.config.presets 345M --format json
"""
import argparse
import json
import shlex
from dataclasses import dataclass
from typing import Optional

from megatron.errors import InputError, run_cli

FULL_RUN_ITERS = 500000
FULL_RUN_LR_DECAY_ITERS = 320000
# A performance run is the first 300 iterations of the full run: same LR schedule, cut short.
PERFORMANCE_RUN_ITERS = 300
RUN_KINDS = ("full", "performance")


@dataclass(frozen=True)
class _Size:
    """One row of docs/ARCHITECTURE.md, Presets, in the table's column order."""
    name: str
    tp: int
    pp: int
    layers: int
    hidden: int
    heads: int
    seq: int
    micro_bs: int
    global_bs: int
    lr: float
    min_lr: float
    no_pipeline: bool = False
    full_run_iters: int = FULL_RUN_ITERS
    lr_decay_iters: int = FULL_RUN_LR_DECAY_ITERS
    experts: int = 1  # mixture of experts in every second layer (upstream's --expert-interval 2) when above 1
    expert_parallel: int = 1
    llama: Optional["_Llama"] = None  # a Llama-style decoder (docs/llama.md) instead of GPT-2


@dataclass(frozen=True)
class _Llama:
    """What a Llama preset sets beyond the shape: RMSNorm, rotary positions, SwiGLU, no linear biases, untied
    output layer unless `tied`, and these sizes."""
    ffn: int  # each SwiGLU branch's width
    kv_heads: int
    rope_theta: int = 10000
    rope_scaling_factor: Optional[float] = None  # Llama 3.1-3.3's llama3 rotary scaling (original context 8192)
    tied: bool = False


# 345M_without_mp: pure data parallel over 8 devices (ZeRO stage 1 is the default), micro batch 8
# fits a 345M model with activation checkpointing on a 32 GB device; global 64 = 8 x DP 8, so one
# micro batch per step, which is what a throughput comparison wants; lr as for 345M.
# tiny: TP2 x PP2 x DP2 over 8 CPU processes exercises every parallel axis; 4 layers split evenly
# over 2 stages, 4 heads split over TP 2, global 8 = micro 2 x DP 2 x 2 micro batches, so gradient
# accumulation and pipeline overlap both happen. 300 iterations take a few minutes on 2 cores, and
# the schedule decays over exactly those 300 (a 500k-iteration "full" run would be no demo).
# 125M_MoE64, 1.3B_MoE128: upstream's examples/MoE/ds_pretrain_gpt_125M_MoE64.sh and ds_pretrain_gpt_1.3B_MoE128.sh
# (b4d4a0e): their shapes, batches and learning rates, --moe-loss-coeff 0.01, no pipeline (upstream runs MoE without
# one), experts spread over one node's 8 ranks (upstream's EP_PARALLEL_SIZE = min(experts, devices) at 8 devices).
# Upstream runs 1.3B_MoE128 on NUM_GPUS=64 at EP 64: on one node of 80 GiB devices it does not fit (the planner and
# the entry scripts say so); on 8 nodes add --moe-expert-parallel-size 64.
# Llama presets: the published shapes (Llama 2 7B / 13B, Llama 3 8B, TinyLlama 1.1B: layers, hidden, heads, key/value
# heads, FFN width, context, rotary theta) with Llama 2's AdamW schedule peak 3e-4 (TinyLlama's 4e-4) decayed to
# 10%; layouts sized for one node of 80 GiB devices (the planner's estimate). llama-tiny: the tiny preset's CPU layout
# with 2 key/value heads for its 4 query heads, so grouped-query attention is split over TP 2. Llama 3.1 8B and 3.2
# 1B / 3B: Llama 3's shape with the llama3 rotary scaling (factor 8, and 32 for 3.2) of their config.json, 3.2 with
# its tied head; trained at 8192 tokens, the context the scaling starts from. llama3.1-tiny: llama-tiny so scaled
# (factor 4 from Llama 3.1's original 8192; the CPU run's 128 tokens stay below it).
_TABLE = (
    #     name               TP PP layers hidden heads  seq  mbs gbs  lr      min lr
    _Size("345M",             1, 2, 24,    1024,  16,   1024, 4,  16, 1.5e-4, 1.5e-5),
    _Size("1.3B",             2, 2, 24,    2048,  16,   1024, 8,  32, 2e-4,   2e-5),
    _Size("2.7B",             2, 2, 32,    2560,  32,   2048, 8,  32, 1.6e-4, 1.6e-5),
    _Size("3.7B",             2, 2, 32,    3072,  32,   2048, 4,  16, 1.2e-4, 1.2e-5),
    _Size("345M_without_mp",  1, 1, 24,    1024,  16,   1024, 8,  64, 1.5e-4, 1.5e-5,
          no_pipeline=True),
    _Size("125M_MoE64",       1, 1, 12,    768,   12,   2048, 4,  256, 4.5e-4, 4.5e-6,
          no_pipeline=True, experts=64, expert_parallel=8),
    _Size("1.3B_MoE128",      1, 1, 24,    2048,  16,   2048, 8,  512, 1.2e-4, 1.0e-6,
          no_pipeline=True, experts=128, expert_parallel=8),
    _Size("tiny",             2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
          full_run_iters=300, lr_decay_iters=300),
    _Size("llama2-7B",        2, 2, 32,    4096,  32,   4096, 1,  32, 3e-4,   3e-5, llama=_Llama(11008, 32)),
    _Size("llama2-13B",       4, 2, 40,    5120,  40,   4096, 1,  32, 3e-4,   3e-5, llama=_Llama(13824, 40)),
    _Size("llama3-8B",        2, 2, 32,    4096,  32,   8192, 1,  32, 3e-4,   3e-5,
          llama=_Llama(14336, 8, rope_theta=500000)),
    _Size("tinyllama-1.1B",   1, 1, 22,    2048,  32,   2048, 8,  64, 4e-4,   4e-5, llama=_Llama(5632, 4)),
    _Size("llama-tiny",       2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
          full_run_iters=300, lr_decay_iters=300, llama=_Llama(128, 2)),
    _Size("llama3.1-8B",      2, 2, 32,    4096,  32,   8192, 1,  32, 3e-4,   3e-5,
          llama=_Llama(14336, 8, rope_theta=500000, rope_scaling_factor=8.0)),
    _Size("llama3.2-1B",      1, 1, 16,    2048,  32,   8192, 2,  64, 3e-4,   3e-5,
          llama=_Llama(8192, 8, rope_theta=500000, rope_scaling_factor=32.0, tied=True)),
    _Size("llama3.2-3B",      2, 1, 28,    3072,  24,   8192, 1,  32, 3e-4,   3e-5,
          llama=_Llama(8192, 8, rope_theta=500000, rope_scaling_factor=32.0, tied=True)),
    _Size("llama3.1-tiny",    2, 2, 4,     64,    4,    128,  2,  8,  3e-3,   3e-4,
          full_run_iters=300, lr_decay_iters=300, llama=_Llama(128, 2, rope_scaling_factor=4.0)),
)


def preset_names():
    """Valid preset names, in table order."""
    return tuple(size.name for size in _TABLE)


def get_preset(name, run="full"):
    """A fresh dict of argparse attribute -> value for preset `name`.

    run="performance" only shortens training to PERFORMANCE_RUN_ITERS; the LR schedule is kept.
    """
    sizes = {size.name: size for size in _TABLE}
    if name not in sizes:
        raise InputError(f"unknown model size preset {name!r}; valid names: "
                         f"{', '.join(preset_names())}")
    if run not in RUN_KINDS:
        raise InputError(f"unknown run kind {run!r}; valid kinds: {', '.join(RUN_KINDS)}")
    size = sizes[name]
    return {
        "tensor_model_parallel_size": size.tp,
        "pipeline_model_parallel_size": size.pp,
        "num_layers": size.layers,
        "hidden_size": size.hidden,
        "num_attention_heads": size.heads,
        "seq_length": size.seq,
        "micro_batch_size": size.micro_bs,
        "global_batch_size": size.global_bs,
        "lr": size.lr,
        "min_lr": size.min_lr,
        "no_pipeline_parallel": size.no_pipeline,
        "checkpoint_activations": True,
        "lr_decay_style": "cosine",
        "lr_warmup_fraction": 0.01,
        "split": "949,50,1",
        "seed": 1234,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "train_iters": size.full_run_iters if run == "full" else PERFORMANCE_RUN_ITERS,
        "lr_decay_iters": size.lr_decay_iters,
        **_moe_values(size),
        **_llama_values(size.llama),
    }


def _llama_values(llama: Optional[_Llama]) -> dict:
    if llama is None:
        return {}
    scaling = {} if llama.rope_scaling_factor is None else {"rope_scaling_type": "llama3",
                                                             "rope_scaling_factor": llama.rope_scaling_factor}
    return {"normalization": "rmsnorm", "use_rotary_position_embeddings": True, "rope_theta": llama.rope_theta,
            "add_position_embedding": False, "swiglu": True, "ffn_hidden_size": llama.ffn,
            "num_key_value_heads": llama.kv_heads, "add_bias_linear": False,
            "untie_embeddings_and_output_weights": not llama.tied, **scaling}


def _moe_values(size: _Size) -> dict:
    if size.experts == 1:
        return {}
    return {"num_experts": [size.experts], "moe_expert_parallel_size": size.expert_parallel, "moe_loss_coeff": 0.01}


def format_shell(preset):
    """KEY=VALUE lines (upper-case attribute names, booleans as true/false) for `eval` in bash."""
    def shell_value(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, list):
            return shlex.quote(" ".join(map(str, value)))
        return shlex.quote(str(value))
    return "".join(f"{key.upper()}={shell_value(value)}\n" for key, value in preset.items())


# Destinations whose flag is not the destination's name: written as upstream spells them.
_SPELLED = {"rope_theta": "--rotary-position-embeddings-theta"}
_TURNED_OFF_BY = {"add_bias_linear": "--disable-bias-linear", "add_position_embedding": "--no-position-embedding"}


def format_flags(preset):
    """Megatron flags one per line; a false boolean flag is left out, as on a command line (a false one whose flag
    turns it off is written as that flag)."""
    lines = []
    for key, value in preset.items():
        flag = _SPELLED.get(key, "--" + key.replace("_", "-"))
        if key in _TURNED_OFF_BY:
            if value is False:
                lines.append(_TURNED_OFF_BY[key])
        elif value is True:
            lines.append(flag)
        elif isinstance(value, list):
            lines.append(" ".join([flag, *map(str, value)]))
        elif value is not False:
            lines.append(f"{flag} {value}")
    return "".join(line + "\n" for line in lines)


def format_json(preset):
    """One JSON object, for tools other than bash."""
    return json.dumps(preset, indent=2) + "\n"


_FORMATTERS = {"shell": format_shell, "flags": format_flags, "json": format_json}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m megatron.config.presets",
        description="Print a model-size preset so shell scripts need not hard-code its numbers.")
    parser.add_argument("name", help=f"one of: {', '.join(preset_names())}")
    parser.add_argument("--format", choices=sorted(_FORMATTERS), default="shell",
                        help="shell: KEY=VALUE lines for eval; flags: Megatron flags one per line; "
                             "json: one object")
    parser.add_argument("--run", choices=RUN_KINDS, default="full",
                        help=f"performance runs stop after {PERFORMANCE_RUN_ITERS} iterations")
    options = parser.parse_args(argv)
    print(_FORMATTERS[options.format](get_preset(options.name, options.run)), end="")
    return 0


if __name__ == "__main__":
    run_cli(main)
