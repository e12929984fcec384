"""The DeepSpeed config: built from the flags, or a user's --deepspeed_config checked against them.

The flags drive the data loader, the model dtype and the LR schedule; DeepSpeed drives batching,
clipping, precision and ZeRO from its JSON. If the two disagreed, the run would silently train
something other than what either says, so a contradiction is an error naming both values.
"""
import json
import math

from megatron.config import JobConfig
from megatron.errors import InputError
from megatron.json_files import read_json_object

# DeepSpeed's own step printing is off: the training loop logs in Megatron's format.
STEPS_PER_PRINT_NEVER = 10 ** 12


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
    if job.optimizer.cpu_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
        # The offloaded state is stepped by torch's AdamW on the CPU (megatron.optimizer), which DeepSpeed
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
    return cpu_optimizer_keys + (
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
    "optimizer": "the optimizer is AdamW from the flags (--lr, --weight-decay, --adam-beta1, --adam-beta2, "
                 "--adam-eps)",
    "scheduler": "the learning-rate schedule comes from the flags (--lr, --min-lr, --lr-decay-style, "
                 "--lr-warmup-iters / -samples / -fraction, --lr-decay-iters / -samples)",
}


def merge_with_user_config(user_json, job: JobConfig, path):
    """The user's DeepSpeed config with omitted keys filled from the flags; InputError if a key it
    sets contradicts a flag, or if it has a section the flags own. `path` names the file in messages.
    "bfloat16" is DeepSpeed's alias of "bf16"."""
    user = dict(user_json)
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
    """The config to hand to deepspeed.initialize: the user's file merged with the flags, or one
    generated from the flags."""
    if job.deepspeed_config is None:
        return build_deepspeed_config(job)
    return merge_with_user_config(load_user_config(job.deepspeed_config), job, job.deepspeed_config)
