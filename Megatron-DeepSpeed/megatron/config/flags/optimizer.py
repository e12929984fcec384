"""Optimizer flags (AdamW or SGD, weight decay, clipping, CPU offload); their checks, and the OptimizerConfig
section."""
from typing import Mapping

from megatron.config.flags.common import Limits, same_named
from megatron.config.job import OptimizerConfig
from megatron.errors import InputError

OPTIMIZERS = ("adam", "sgd")
LIMITS = Limits(positive=("adam_eps",), non_negative=("weight_decay", "clip_grad"),
                fractions=("adam_beta1", "adam_beta2"))



def weight_decayed(shape) -> bool:
    """--weight-decay applies to weight matrices only: biases and LayerNorm parameters (one dimension) are not
    decayed, as in Megatron. The one rule for the optimizer's groups and for reading or writing their state."""
    return len(shape) > 1

def add_flags(parser) -> None:
    group = parser.add_argument_group("optimizer")
    group.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                       help="adam: AdamW with --adam-beta1/2 and --adam-eps; sgd: SGD with --sgd-momentum.")
    group.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay.")
    group.add_argument("--clip-grad", type=float, default=1.0,
                       help="Clip the global gradient norm to this (0 = no clipping).")
    group.add_argument("--adam-beta1", type=float, default=0.9)
    group.add_argument("--adam-beta2", type=float, default=0.999)
    group.add_argument("--adam-eps", type=float, default=1e-8)
    group.add_argument("--sgd-momentum", type=float, default=0.9, help="Momentum of --optimizer sgd.")
    group.add_argument("--cpu-optimizer", action="store_true",
                       help="Keep optimizer state on the CPU (DeepSpeed ZeRO offload_optimizer).")
    group.add_argument("--cpu_torch_adam", action="store_true",
                       help="Accepted; always so here: --cpu-optimizer steps torch's AdamW on the CPU.")


def validate(values: Mapping) -> None:
    """Needs --zero-stage settled."""
    if not 0 <= values["sgd_momentum"] < 1:
        raise InputError(f"--sgd-momentum {values['sgd_momentum']} is out of range: it must be in [0, 1)")
    if values["cpu_optimizer"] and values["zero_stage"] == 0:
        raise InputError("--cpu-optimizer offloads ZeRO optimizer state, but --zero-stage is 0; "
                         "use --zero-stage 1, 2 or 3")


def section(values: Mapping) -> OptimizerConfig:
    return same_named(OptimizerConfig, values)
