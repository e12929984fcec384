"""Parallelism and DeepSpeed flags: tensor, pipeline and sequence parallelism, the engine, the process-group
backend, ZeRO (whose flags become keys of the generated DeepSpeed config, megatron/config/ds_config.py), and the
user's --deepspeed_config, read here once; their checks against the world size, and the ParallelConfig section."""
import logging
import os
from types import MappingProxyType
from typing import Mapping, Optional

from megatron.config.deepspeed_keys import OPT_OUT_FLAG, check_top_level_keys
from megatron.config.ds_config import SECTIONS_HANDLED_HERE, load_user_config
from megatron.config.flags.common import Limits, after_preset, same_named
from megatron.config.job import ParallelConfig
from megatron.errors import InputError, require_divisible

DISTRIBUTED_BACKENDS = ("nccl", "hccl", "gloo", "ccl")
BACKEND_BY_DEVICE = MappingProxyType(
    {"cuda": "nccl", "npu": "hccl", "hpu": "hccl", "xpu": "ccl", "cpu": "gloo"})
REMOTE_DEVICES = ("none", "cpu", "nvme")
DEEPSPEED_JSON = "deepspeed_json"  # the value holding the user's DeepSpeed JSON as read (None without one)
LIMITS = Limits(positive=("tensor_model_parallel_size", "pipeline_model_parallel_size", "ds_sequence_parallel_size"))
PRESET_DEFAULTS = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "no_pipeline_parallel": False}

_log = logging.getLogger(__name__)


def add_flags(parser) -> None:
    group = parser.add_argument_group("parallelism and DeepSpeed")
    add_model_parallel_flags(group)
    group.add_argument("--sequence-parallel", action="store_true",
                       help="Split LayerNorm/dropout activations along the sequence over TP.")
    group.add_argument("--ds-sequence-parallel-size", "--ds_sequence_parallel_size", type=int, default=1,
                       help="DeepSpeed-Ulysses: split each sequence over N ranks, attention heads exchanged by "
                            "all-to-all (needs TP 1, PP 1, --no-pipeline-parallel; N divides the heads and "
                            "--seq-length). World = TP x PP x DP x N.")
    group.add_argument("--no-pipeline-parallel", action="store_true", default=None,
                       help="Use DeepSpeed's plain engine instead of its pipeline engine "
                            "(needs --pipeline-model-parallel-size 1).")
    add_backend_flag(group)
    group.add_argument("--deepspeed", "--deepscale", action="store_true",
                       help="Accepted; training always runs on DeepSpeed.")
    group.add_argument("--deepspeed_config", "--deepscale_config",
                       help="DeepSpeed JSON; default: generated from these flags.")
    group.add_argument(OPT_OUT_FLAG, action="store_true",
                       help="Train with top-level keys of --deepspeed_config that DeepSpeed does not know (it "
                            "ignores them); without it such a key is an error naming the closest known key.")
    group.add_argument("--local_rank", "--local-rank", type=int,
                       help="Passed by the deepspeed launcher: becomes LOCAL_RANK when the environment has "
                            "none, and must agree with it otherwise.")
    _add_zero_flags(parser)
    _add_ddp_switches(parser)


def add_model_parallel_flags(group, default=None, tensor_help=None, pipeline_help=None) -> None:
    """--tensor-model-parallel-size and --pipeline-model-parallel-size; without a default a preset may set them."""
    group.add_argument("--tensor-model-parallel-size", type=int, default=default,
                       help=tensor_help or after_preset(PRESET_DEFAULTS["tensor_model_parallel_size"]))
    group.add_argument("--pipeline-model-parallel-size", type=int, default=default,
                       help=pipeline_help or after_preset(PRESET_DEFAULTS["pipeline_model_parallel_size"]))


def add_backend_flag(group) -> None:
    group.add_argument("--distributed-backend", choices=DISTRIBUTED_BACKENDS,
                       help="Default: chosen by the device (nccl, hccl or gloo).")


def _add_zero_flags(parser) -> None:
    group = parser.add_argument_group(
        "ZeRO", "Upstream declares these without using them (its DeepSpeed JSON decides); here a flag that is "
        "given sets its key, and a JSON that says otherwise is an error, like every other flag.")
    group.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3),
                       help="ZeRO stage. Default: the --deepspeed_config JSON's zero_optimization.stage, "
                            "else 1 (Megatron-DeepSpeed's default) over several data-parallel ranks and 0 over one "
                            "(1 with --cpu-optimizer, or --sequence-parallel with --bf16 on the pipeline engine); "
                            "a resumed checkpoint's stage when it loads the optimizer state.")
    group.add_argument("--zero-reduce-scatter", action="store_true",
                       help="zero_optimization.reduce_scatter: average gradients with reduce-scatter.")
    group.add_argument("--zero-contigious-gradients", action="store_true",
                       help="zero_optimization.contiguous_gradients: copy gradients into one buffer as they "
                            "are produced. Upstream's spelling.")
    group.add_argument("--zero-reduce-bucket-size", type=int, default=0,
                       help="zero_optimization.reduce_bucket_size in elements (0: DeepSpeed's default).")
    group.add_argument("--zero-allgather-bucket-size", type=int, default=0,
                       help="zero_optimization.allgather_bucket_size in elements (0: DeepSpeed's default).")
    group.add_argument("--remote-device", choices=REMOTE_DEVICES, default="none",
                       help="ZeRO-3: keep the partitioned parameters on this device "
                            "(zero_optimization.offload_param.device; nvme needs a JSON with its nvme_path).")
    group.add_argument("--use-pin-memory", action="store_true",
                       help="ZeRO-3 with --remote-device cpu: pin that memory (offload_param.pin_memory).")


def _add_ddp_switches(parser) -> None:
    ddp = parser.add_argument_group(
        "upstream DDP switches", "Accepted for upstream scripts; DeepSpeed reduces gradients here, so they "
        "change nothing.")
    ddp.add_argument("--DDP-impl", choices=("local", "torch"), default="local")
    ddp.add_argument("--use-contiguous-buffers-in-ddp", action="store_true")
    ddp.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true")
    ddp.add_argument("--no-scatter-gather-tensors-in-pipeline", action="store_false",
                     dest="scatter_gather_tensors_in_pipeline")
    ddp.add_argument("--no-async-tensor-model-parallel-allreduce", action="store_false",
                     dest="async_tensor_model_parallel_allreduce",
                     help="No effect: upstream overlaps a column-parallel layer's input-gradient all-reduce with "
                          "its weight-gradient GEMM through a CUDA stream trick; here autograd runs the same "
                          "all-reduce, and the result is the same either way.")


def sizes(values: Mapping, world_size: int) -> dict:
    """The world size and the data-parallel size it leaves: DP = world / (TP x PP x SP)."""
    tp, pp, sp = (values["tensor_model_parallel_size"], values["pipeline_model_parallel_size"],
                  values["ds_sequence_parallel_size"])
    if world_size < 1:
        raise InputError(f"world size {world_size} must be at least 1; check the launcher (WORLD_SIZE)")
    sizes_named = f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp}" + (
        f" x --ds-sequence-parallel-size {sp}" if sp > 1 else "")
    model_parallel = tp * pp * sp
    if world_size < model_parallel:
        raise InputError(
            f"{sizes_named} needs at least {model_parallel} processes (one per device), but world size is "
            f"{world_size}; launch {model_parallel} or a multiple (e.g. torchrun --nproc_per_node {model_parallel}), "
            f"or lower those sizes")
    require_divisible("world size", world_size, f"{sizes_named} =", model_parallel,
                      f"launch a multiple of {model_parallel} processes or lower those sizes")
    return {"world_size": world_size, "data_parallel_size": world_size // model_parallel}


def deepspeed_json(values: Mapping) -> dict:
    """The user's --deepspeed_config, read once (None without one), and --zero-stage: when not given, the JSON's
    stage (upstream's scripts often set it only there), else default_zero_stage's."""
    path, stage = values["deepspeed_config"], values["zero_stage"]
    user = None
    if path is not None:
        if not os.path.isfile(path):
            raise InputError(f"--deepspeed_config {path} does not exist; give a DeepSpeed JSON file, or drop the "
                             f"flag to generate one from the flags")
        user = MappingProxyType(load_user_config(path))
        if not values["allow_unknown_deepspeed_keys"]:
            check_top_level_keys(user, path, also_known=SECTIONS_HANDLED_HERE)
    if stage is None:
        zero = user.get("zero_optimization") if user is not None else None
        stage = zero.get("stage") if isinstance(zero, dict) else None
        if stage not in (None, 0, 1, 2, 3):
            raise InputError(f"--deepspeed_config {path} sets zero_optimization.stage={stage!r}; use 0, 1, 2 or 3")
    if stage is not None:
        return {"zero_stage": stage, "zero_stage_chosen": True, "zero_stage_note": None, DEEPSPEED_JSON: user}
    stage, note = default_zero_stage(values)
    return {"zero_stage": stage, "zero_stage_chosen": False, "zero_stage_note": note, DEEPSPEED_JSON: user}


def default_zero_stage(values: Mapping) -> tuple[int, Optional[str]]:
    """The ZeRO stage of a run whose user chose none, and for one data-parallel rank the line that says why.

    ZeRO 1 (Megatron-DeepSpeed's default) partitions the optimizer state over the data-parallel ranks; over one
    rank it partitions nothing, yet DeepSpeed still keeps its flat fp32 copies of the weights and gradients (a
    680M GPT at TP 2 in fp32 peaked at 10.4 GB per rank at ZeRO 1, 6.3 GB at ZeRO 0). So one data-parallel rank
    trains at ZeRO 0, unless a flag needs ZeRO 1. DeepSpeed-Ulysses ranks hold the same weights, and ZeRO
    partitions over them too (DeepSpeed's sequence-data-parallel group): several of them count as several."""
    if values["data_parallel_size"] * values["ds_sequence_parallel_size"] > 1:
        return 1, None
    if values["cpu_optimizer"]:
        needs = "--cpu-optimizer offloads ZeRO's optimizer state, which needs ZeRO 1 or higher"
    elif (values["sequence_parallel"] and values["tensor_model_parallel_size"] > 1 and values["bf16"]
          and not values["no_pipeline_parallel"]):
        needs = ("--sequence-parallel with --bf16 on the pipeline engine needs ZeRO 1 (at ZeRO 0 DeepSpeed's bf16 "
                 "pipeline optimizer takes the gradients before the sequence-parallel ones are summed)")
    else:
        return 0, ("ZeRO stage 0: one data-parallel rank, over which ZeRO 1 would partition nothing and only add "
                   "DeepSpeed's fp32 copies of the weights and gradients (--zero-stage 1 to use it anyway)")
    return 1, f"ZeRO stage 1 with one data-parallel rank: {needs} (--zero-stage chooses)"


def validate_zero(values: Mapping) -> None:
    for dest in ("zero_reduce_bucket_size", "zero_allgather_bucket_size"):
        if values[dest] < 0:
            raise InputError(f"--{dest.replace('_', '-')} {values[dest]} must be 0 (DeepSpeed's default) "
                             "or a positive number of elements")
    remote = values["remote_device"]
    if remote != "none" and values["zero_stage"] != 3:
        raise InputError(f"--remote-device {remote} places ZeRO-3's partitioned parameters, but "
                         f"--zero-stage is {values['zero_stage']}; use --zero-stage 3 or drop it")
    if values["use_pin_memory"] and remote != "cpu":
        raise InputError("--use-pin-memory pins the CPU memory of --remote-device cpu; add --remote-device cpu "
                         "or drop it")


def features(values: Mapping) -> dict:
    """Sequence parallelism (off, with a warning, at TP 1) and the engine, checked against the layout and ZeRO."""
    tp, pp, zero_stage = (values["tensor_model_parallel_size"], values["pipeline_model_parallel_size"],
                          values["zero_stage"])
    sequence_parallel = values["sequence_parallel"]
    if sequence_parallel and tp == 1:
        _log.warning("--sequence-parallel has no effect with --tensor-model-parallel-size 1; turning it off")
        sequence_parallel = False
    if sequence_parallel and values["seq_length"] % tp:
        raise InputError(f"--sequence-parallel splits --seq-length {values['seq_length']} over "
                         f"--tensor-model-parallel-size {tp}, which does not divide it; use a multiple of {tp}")
    layers = values["num_layers"]
    if pp > layers:
        raise InputError(f"--pipeline-model-parallel-size {pp} is more than --num-layers {layers}: every pipeline "
                         f"stage needs a transformer layer; use at most {layers} stages or more layers (uneven "
                         f"splits are fine: stages are cut between layers as evenly as possible)")
    if values["no_pipeline_parallel"] and pp > 1:
        raise InputError(f"--no-pipeline-parallel contradicts --pipeline-model-parallel-size {pp}; drop one of them")
    pipeline_engine = not values["no_pipeline_parallel"]
    if zero_stage >= 2 and pipeline_engine:
        fix = "use --zero-stage 0 or 1" if pp > 1 else "use --zero-stage 0 or 1, or add --no-pipeline-parallel"
        raise InputError(f"--zero-stage {zero_stage} with --pipeline-model-parallel-size {pp}: DeepSpeed's pipeline "
                         f"engine supports only ZeRO stages 0 and 1; {fix}")
    if sequence_parallel:
        _check_sequence_parallel_gradients(zero_stage, values["bf16"], pipeline_engine)
    if values["ds_sequence_parallel_size"] > 1:
        _check_ulysses(values, pipeline_engine)
    return {"sequence_parallel": sequence_parallel, "ds_pipeline_enabled": pipeline_engine}


def _check_sequence_parallel_gradients(zero_stage: int, bf16: bool, pipeline_engine: bool) -> None:
    """Sequence-parallel gradients are summed over the tensor-parallel ranks once per step, from the gradients
    accumulated on the parameters (megatron/tensor_parallel/sequence_parallel_grads.py); refuse the DeepSpeed
    modes that take the gradients off the parameters during backward."""
    if zero_stage >= 2:
        raise InputError(f"--sequence-parallel with --zero-stage {zero_stage}: ZeRO stages 2 and 3 partition each "
                         f"gradient during backward, before the sequence-parallel gradients are summed over the "
                         f"tensor-parallel ranks at the end of the step; use --zero-stage 0 or 1")
    if bf16 and zero_stage == 0 and pipeline_engine:
        raise InputError("--sequence-parallel with --bf16 and --zero-stage 0 on the pipeline engine: DeepSpeed's "
                         "bf16 pipeline optimizer moves each micro-batch's gradients into fp32 buffers during "
                         "backward, before the sequence-parallel gradients are summed at the end of the step; "
                         "use --zero-stage 1")


def _check_ulysses(values: Mapping, pipeline_engine: bool) -> None:
    """DeepSpeed-Ulysses as upstream main runs it (megatron/core/parallel_state.py refuses TP or PP with it):
    on the plain engine, each rank holding whole attention heads of the whole sequence between two all-to-alls."""
    sp = values["ds_sequence_parallel_size"]
    flag = f"--ds-sequence-parallel-size {sp}"
    tp, pp = values["tensor_model_parallel_size"], values["pipeline_model_parallel_size"]
    if tp > 1 or pp > 1:
        raise InputError(f"{flag} with --tensor-model-parallel-size {tp} and --pipeline-model-parallel-size {pp}: "
                         "DeepSpeed-Ulysses runs with tensor and pipeline parallel size 1, as upstream "
                         "Megatron-DeepSpeed's; use sizes 1 (the rest of the ranks become data parallel)")
    if pipeline_engine:
        raise InputError(f"{flag} runs on DeepSpeed's plain engine, as upstream's sequence-parallel scripts do; "
                         "add --no-pipeline-parallel")
    heads, groups = values["num_attention_heads"], values["num_key_value_heads"] or values["num_attention_heads"]
    size = "--ds-sequence-parallel-size"  # require_divisible adds the value: not `flag`, which holds it already
    require_divisible("--num-attention-heads", heads, size, sp, "each sequence-parallel rank attends with whole "
                      "heads; choose a size that divides the head count")
    require_divisible("--num-key-value-heads", groups, size, sp, "each sequence-parallel rank needs whole "
                      "key/value heads; choose a size that divides them")
    require_divisible("--seq-length", values["seq_length"], size, sp, "each rank holds an equal chunk of every "
                      "sequence; choose a length that is a multiple of the size")
    if values["num_experts"] and max(values["num_experts"]) > 1:
        raise InputError(f"{flag} with --num-experts {values['num_experts']}: mixture-of-experts layers are not "
                         "built with DeepSpeed-Ulysses here; use one of them")


def backend(values: Mapping, device_name: str) -> dict:
    """--distributed-backend, by default the device's."""
    if values["distributed_backend"] is not None:
        return {}
    if device_name not in BACKEND_BY_DEVICE:
        raise InputError(f"no default --distributed-backend for device '{device_name}'; pass "
                         f"one of {', '.join(DISTRIBUTED_BACKENDS)}")
    return {"distributed_backend": BACKEND_BY_DEVICE[device_name]}


def section(values: Mapping) -> ParallelConfig:
    return same_named(ParallelConfig, values, tensor=values["tensor_model_parallel_size"],
                      pipeline=values["pipeline_model_parallel_size"], data=values["data_parallel_size"],
                      pipeline_engine=values["ds_pipeline_enabled"])
