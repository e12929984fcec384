"""Mixed-precision flags (fp16 with loss scaling, or bf16); their checks against the device, and the
PrecisionConfig section."""
import math
from typing import Mapping

from megatron.config.flags.common import Limits, same_named
from megatron.config.job import PrecisionConfig
from megatron.errors import InputError

DEVICES_WITHOUT_FP16 = frozenset({"cpu"})
LIMITS = Limits(positive=("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"))


def add_flags(parser) -> None:
    group = parser.add_argument_group("mixed precision")
    add_dtype_flags(group)
    group.add_argument("--loss-scale", type=float,
                       help="Static fp16 loss scale. Default: dynamic loss scaling.")
    group.add_argument("--initial-loss-scale", type=float, default=2.0 ** 32,
                       help="First dynamic loss scale (a power of two).")
    group.add_argument("--min-loss-scale", type=float, default=1.0,
                       help="Dynamic loss scale never goes below this.")
    group.add_argument("--loss-scale-window", type=int, default=1000,
                       help="Overflow-free steps before the dynamic loss scale grows.")
    group.add_argument("--hysteresis", type=int, default=2,
                       help="Overflows tolerated before the dynamic loss scale shrinks.")


def add_dtype_flags(container) -> None:
    """--fp16 and --bf16; generation and evaluation put them in a mutually exclusive group."""
    container.add_argument("--fp16", action="store_true",
                           help="Run in float16 (training adds loss scaling; not on CPU).")
    container.add_argument("--bf16", action="store_true", help="Run in bfloat16 (default fp32).")


def validate(values: Mapping, device_name: str) -> None:
    if values["fp16"] and values["bf16"]:
        raise InputError("--fp16 and --bf16 were both given; choose one (or neither for fp32)")
    if values["fp16"] and device_name in DEVICES_WITHOUT_FP16:
        raise InputError(f"--fp16 is not supported on device '{device_name}'; use --bf16, or "
                         f"leave both --fp16 and --bf16 off to train in fp32")
    scale = values["initial_loss_scale"]
    if not math.log2(scale).is_integer():
        raise InputError(f"--initial-loss-scale {scale} is not a power of two "
                         f"(DeepSpeed takes its log2); use e.g. {2.0 ** round(math.log2(scale))}")


def section(values: Mapping) -> PrecisionConfig:
    return same_named(PrecisionConfig, values)
