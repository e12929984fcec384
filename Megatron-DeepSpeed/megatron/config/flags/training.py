"""Training flags: batch sizes (and upstream's batch-size ramp-up), the seed and --exit-interval; their checks
against the data-parallel size, and the BatchConfig section."""
from typing import Mapping

from megatron.config.flags.common import Limits, after_preset, same_named
from megatron.config.job import BatchConfig
from megatron.errors import InputError

LIMITS = Limits(required=("micro_batch_size",), positive=("micro_batch_size", "global_batch_size", "exit_interval"))
PRESET_DEFAULTS = {"seed": 1234}


def add_flags(parser) -> None:
    group = parser.add_argument_group("training")
    add_micro_batch_flag(group, help="Samples per device per step.")
    group.add_argument("--global-batch-size", type=int,
                       help="Samples per optimizer step over all data parallel ranks. "
                            "Default micro batch x data parallel size.")
    group.add_argument("--rampup-batch-size", nargs="*",
                       help="START INCREMENT SAMPLES: begin with global batch START and grow it by INCREMENT "
                            "in equal sample intervals until SAMPLES samples are consumed, then use "
                            "--global-batch-size. Needs --train-samples.")
    group.add_argument("--seed", type=int, help="Random seed. " + after_preset(PRESET_DEFAULTS["seed"]))
    group.add_argument("--exit-interval", type=int,
                       help="Stop after the iteration that is a multiple of this.")


def add_micro_batch_flag(group, default=None, help=None) -> None:
    """--micro-batch-size; generation and evaluation give it a default."""
    group.add_argument("--micro-batch-size", type=int, default=default, help=help)


def batch_sizes(values: Mapping) -> dict:
    """The default global batch (one micro-batch per data-parallel rank) and the micro-batches per step."""
    micro, dp = values["micro_batch_size"], values["data_parallel_size"]
    step = micro * dp
    global_batch = values["global_batch_size"] if values["global_batch_size"] is not None else step
    if global_batch % step:
        nearby = sorted({max(step, global_batch // step * step), (global_batch // step + 1) * step})
        raise InputError(
            f"--global-batch-size {global_batch} is not divisible by "
            f"--micro-batch-size {micro} x data parallel size {dp} (world size {values['world_size']} "
            f"/ (TP {values['tensor_model_parallel_size']} x PP {values['pipeline_model_parallel_size']}))"
            f" = {step}; use a multiple of {step}, e.g. {' or '.join(map(str, nearby))}")
    return {"global_batch_size": global_batch, "num_micro_batches": global_batch // step}


def _rampup_values(raw) -> tuple[int, int, int]:
    if len(raw) != 3:
        raise InputError(f"--rampup-batch-size {' '.join(raw)}: give three numbers, START INCREMENT SAMPLES, "
                         "e.g. --rampup-batch-size 16 16 5859375")
    try:
        start, increment, samples = (int(value) for value in raw)
    except ValueError:
        raise InputError(f"--rampup-batch-size {' '.join(raw)}: START INCREMENT SAMPLES must be whole "
                         "numbers") from None
    return start, increment, samples


def rampup(values: Mapping) -> dict:
    """--rampup-batch-size as three whole numbers that reach --global-batch-size in whole micro-batch steps."""
    if values["rampup_batch_size"] is None:
        return {}
    start, increment, samples = _rampup_values(values["rampup_batch_size"])
    if values["train_iters"] or not values["train_samples"]:
        raise InputError("--rampup-batch-size counts samples; give the training length as --train-samples "
                         "instead of --train-iters (as upstream requires)")
    micro, dp = values["micro_batch_size"], values["data_parallel_size"]
    step, target = micro * dp, values["global_batch_size"]
    if start <= 0 or increment <= 0 or samples < 0:
        raise InputError(f"--rampup-batch-size {start} {increment} {samples}: START and INCREMENT must be "
                         "positive and SAMPLES at least 0")
    if start > target or (target - start) % increment:
        raise InputError(f"--rampup-batch-size {start} {increment} {samples} must reach --global-batch-size "
                         f"{target} in whole increments: {target} - {start} must be a non-negative multiple "
                         f"of {increment}")
    for name, value in (("START", start), ("INCREMENT", increment)):
        if value % step:
            raise InputError(f"--rampup-batch-size {name} {value} is not a multiple of --micro-batch-size "
                             f"{micro} x data parallel size {dp} = {step}")
    if values["sequence_parallel"] and values["tensor_model_parallel_size"] > 1:
        raise InputError("--rampup-batch-size with --sequence-parallel is not supported yet: the sequence-parallel "
                         "gradient sum counts a fixed number of micro-batches per step; drop one of them")
    return {"rampup_batch_size": [start, increment, samples]}


def section(values: Mapping) -> BatchConfig:
    ramp = values["rampup_batch_size"]
    return same_named(BatchConfig, values, rampup=tuple(ramp) if ramp else None)
