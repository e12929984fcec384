"""The DeepSpeed config: built from the flags, or a user's --deepspeed_config checked against them.

The flags drive the data loader, the model dtype and the LR schedule; DeepSpeed drives batching,
clipping, precision and ZeRO from its JSON. If the two disagreed, the run would silently train
something other than what either says, so a contradiction is an error naming both values.
"""
import json
import math

from megatron.config.curriculum import SECTION as CURRICULUM_SECTION
from megatron.config.job import JobConfig, ParallelConfig
from megatron.errors import InputError
from megatron.files.user_json import read_json_object

# DeepSpeed's own step printing is off: the training loop logs in Megatron's format.
STEPS_PER_PRINT_NEVER = 10 ** 12

# Sections of a user's JSON that switch on DeepSpeed features this trainer does not drive, with their names.
_UNSUPPORTED_SECTIONS = {"data_efficiency": "data efficiency (data-analyzer curriculum learning / random "
                         "layer-token drop)", "compression_training": "compression training"}
# Top-level keys of a user's JSON this module deals with itself (dropped when off, refused when on; the
# sequence-length curriculum, which current DeepSpeed refuses in its config, is driven by the training loop),
# whether or not DeepSpeed's engine reads them.
SECTIONS_HANDLED_HERE = frozenset(_UNSUPPORTED_SECTIONS) | {CURRICULUM_SECTION}


def _zero_flag_keys(parallel: ParallelConfig):
    """(key under zero_optimization, value, what the flag says) for each ZeRO flag the user gave."""
    keys = []
    if parallel.zero_reduce_scatter:
        keys.append(("reduce_scatter", True, "--zero-reduce-scatter is on"))
    if parallel.zero_contigious_gradients:
        keys.append(("contiguous_gradients", True, "--zero-contigious-gradients is on"))
    for flag, key, value in (("--zero-reduce-bucket-size", "reduce_bucket_size", parallel.zero_reduce_bucket_size),
                             ("--zero-allgather-bucket-size", "allgather_bucket_size",
                              parallel.zero_allgather_bucket_size)):
        if value:
            keys.append((key, value, f"{flag} is {value}"))
    return keys


def _offload_param(parallel: ParallelConfig):
    """zero_optimization.offload_param of --remote-device / --use-pin-memory, or None."""
    if parallel.remote_device == "none":
        return None
    return {"device": parallel.remote_device, "pin_memory": parallel.use_pin_memory}


def build_deepspeed_config(job: JobConfig):
    """DeepSpeed's config dict for a job."""
    batch, precision = job.batch, job.precision
    zero = {"stage": job.parallel.zero_stage}
    config = {
        "train_batch_size": batch.global_batch_size,
        "train_micro_batch_size_per_gpu": batch.micro_batch_size,
        "gradient_accumulation_steps": batch.num_micro_batches,
        "gradient_clipping": job.optimizer.clip_grad,
        "zero_optimization": zero,
        "fp16": {
            "enabled": precision.fp16,
            "loss_scale": precision.loss_scale or 0,
            "initial_scale_power": round(math.log2(precision.initial_loss_scale)),
            "loss_scale_window": precision.loss_scale_window,
            "hysteresis": precision.hysteresis,
            "min_loss_scale": precision.min_loss_scale,
        },
        "bf16": {"enabled": precision.bf16},
        "steps_per_print": STEPS_PER_PRINT_NEVER,
        "wall_clock_breakdown": False,
    }
    zero.update({key: value for key, value, _ in _zero_flag_keys(job.parallel)})
    if _offload_param(job.parallel):
        zero["offload_param"] = _offload_param(job.parallel)
    if job.optimizer.optimizer == "sgd" and job.parallel.zero_stage > 0:
        config["zero_allow_untested_optimizer"] = True  # ZeRO steps torch's SGD like any torch optimizer
    if job.optimizer.cpu_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
        # The offloaded state is stepped by torch's AdamW on the CPU (megatron.training.optimizer), which DeepSpeed
        # refuses unless told: it wants its DeepSpeedCPUAdam, a C++ op our set-up does not prebuild and that
        # takes minutes to JIT-compile at first use. torch's AdamW needs no compiler, works beside every
        # accelerator, and updates exactly as a run without offload does.
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def _flag_values(job: JobConfig):
    """(config key path, what the flags say, how to name that in a message) for every key the
    user's JSON must agree with."""
    batch, precision, cpu_optimizer = job.batch, job.precision, job.optimizer.cpu_optimizer
    offload = "cpu" if cpu_optimizer else "none"
    cpu_optimizer_keys = ((("zero_force_ds_cpu_optimizer",), False,
                           "--cpu-optimizer steps torch's AdamW on the CPU, not DeepSpeedCPUAdam"),
                          ) if cpu_optimizer else ()
    parallel = job.parallel
    zero_keys = tuple((("zero_optimization", key), value, says) for key, value, says in _zero_flag_keys(parallel))
    if _offload_param(parallel):
        zero_keys += tuple((("zero_optimization", "offload_param", key), value,
                            f"--remote-device {parallel.remote_device} / --use-pin-memory "
                            f"{'on' if parallel.use_pin_memory else 'off'} give {key} {value}")
                           for key, value in _offload_param(parallel).items())
    if job.optimizer.optimizer == "sgd" and parallel.zero_stage > 0:
        zero_keys += ((("zero_allow_untested_optimizer",), True,
                       "--optimizer sgd under ZeRO needs DeepSpeed to accept torch's SGD"),)
    return cpu_optimizer_keys + zero_keys + (
        (("train_batch_size",), batch.global_batch_size,
         f"--global-batch-size is {batch.global_batch_size}"),
        (("train_micro_batch_size_per_gpu",), batch.micro_batch_size,
         f"--micro-batch-size is {batch.micro_batch_size}"),
        (("gradient_accumulation_steps",), batch.num_micro_batches,
         f"--global-batch-size {batch.global_batch_size} / (--micro-batch-size "
         f"{batch.micro_batch_size} x data parallel size {job.parallel.data}) is "
         f"{batch.num_micro_batches}"),
        (("gradient_clipping",), job.optimizer.clip_grad, f"--clip-grad is {job.optimizer.clip_grad}"),
        (("fp16", "enabled"), precision.fp16, f"--fp16 is {'on' if precision.fp16 else 'off'}"),
        (("bf16", "enabled"), precision.bf16, f"--bf16 is {'on' if precision.bf16 else 'off'}"),
        (("zero_optimization", "stage"), job.parallel.zero_stage, f"--zero-stage is {job.parallel.zero_stage}"),
        (("zero_optimization", "offload_optimizer", "device"), offload,
         f"--cpu-optimizer is {'on' if cpu_optimizer else 'off'}"),
    )


def _lookup(config, path):
    """The value at a key path, or None where the JSON does not set it."""
    for key in path:
        if not isinstance(config, dict) or key not in config:
            return None
        config = config[key]
    return config


def _fill_missing(user, generated, path, where):
    """User values win; keys the user omitted (or set to null) come from `generated`."""
    merged = dict(user)
    for key, value in generated.items():
        if merged.get(key) is None:
            merged[key] = value
        elif isinstance(value, dict):
            if not isinstance(merged[key], dict):
                raise InputError(f"--deepspeed_config {where} sets {'.'.join(path + (key,))}="
                                 f"{json.dumps(merged[key])}, but it must be a JSON object")
            merged[key] = _fill_missing(merged[key], value, path + (key,), where)
    return merged


# Sections DeepSpeed would silently ignore or override: the loop passes its own optimizer and sets the
# learning rate itself before every step.
_SECTIONS_THE_FLAGS_OWN = {
    "optimizer": "the optimizer comes from the flags (--optimizer, --lr, --weight-decay, --adam-beta1, "
                 "--adam-beta2, --adam-eps, --sgd-momentum)",
    "scheduler": "the learning-rate schedule comes from the flags (--lr, --min-lr, --lr-decay-style, "
                 "--lr-warmup-iters / -samples / -tokens / -fraction, --lr-decay-iters / -samples / -tokens)",
}


def _switches(value) -> list:
    """The `enabled` values found below a section (in its parts, their parts ...)."""
    if not isinstance(value, dict):
        return []
    return [part["enabled"] for part in value.values() if isinstance(part, dict) and "enabled" in part] + \
        [switch for part in value.values() for switch in _switches(part)]


def _switches_on(section) -> bool:
    """Whether a section turns its feature on: `enabled`, and where its parts have switches of their own, one of
    them too (DeepSpeed reads each part's switch whatever the section's says; upstream's data-efficiency baseline
    script enables the library with every part off, which trains as without it)."""
    if not isinstance(section, dict) or not section.get("enabled"):
        return False
    parts = _switches(section)
    return not parts or any(parts)


def _without_unsupported_sections(user, path):
    """The user's JSON minus switched-off sections of features this trainer does not drive, and minus the
    curriculum_learning section (upstream's GPT templates carry one, enabled or not, a key current DeepSpeed
    refuses either way; the loop drives it: JobConfig.curriculum); an enabled unsupported one is an InputError."""
    kept = {key: value for key, value in user.items() if key != CURRICULUM_SECTION}
    for section, feature in _UNSUPPORTED_SECTIONS.items():
        if section not in kept:
            continue
        if _switches_on(kept[section]):
            raise InputError(f"--deepspeed_config {path}: {section}: Megatron-DeepSpeed's {feature} is not "
                             f"supported by this trainer; set {section}.enabled to false or remove the section")
        del kept[section]
    return kept


def merge_with_user_config(user_json, job: JobConfig, path):
    """The user's DeepSpeed config with omitted keys filled from the flags; InputError if a key it
    sets contradicts a flag, if it has a section the flags own, or if it turns on a feature this trainer does
    not drive. `path` names the file in messages. "bfloat16" is DeepSpeed's alias of "bf16"."""
    user = _without_unsupported_sections(user_json, path)
    for section, owner in _SECTIONS_THE_FLAGS_OWN.items():
        if user.get(section) is not None:
            raise InputError(f"--deepspeed_config {path} has an {section!r} section, which would be ignored: {owner}; "
                             f"remove the section and set those flags instead")
    if "bfloat16" in user:
        user.setdefault("bf16", user.pop("bfloat16"))
    merged = _fill_missing(user, build_deepspeed_config(job), (), path)
    for key_path, flag_value, flag_says in _flag_values(job):
        user_value = _lookup(user, key_path)
        if user_value is not None and user_value != flag_value:
            raise InputError(
                f"--deepspeed_config {path} sets {'.'.join(key_path)}={json.dumps(user_value)} "
                f"but {flag_says}; make them agree or remove the key from the JSON")
    return merged


def load_user_config(path):
    """Read a DeepSpeed JSON file; bad JSON is an InputError with file, line and column."""
    return read_json_object(path, f"--deepspeed_config {path}",
                            "fix the file or drop the flag to generate the config from the flags")


def resolve_deepspeed_config(job: JobConfig):
    """The config to hand to deepspeed.initialize: the user's JSON (read once, while the flags were checked) merged
    with the flags, or one generated from the flags."""
    if job.deepspeed_json is None:
        return build_deepspeed_config(job)
    return merge_with_user_config(job.deepspeed_json, job, job.deepspeed_config)
