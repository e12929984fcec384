"""Megatron-DeepSpeed's command line, put together from the flag groups of megatron/config/flags/.

    parse_args(argv)                          -> Namespace: the flags, --model-size and defaults settled
    validate_args(args, world_size, device)   -> a new Namespace: checked, with the values that need the world
                                                 size and the device (data parallel size, batch defaults, backend)
    job_config(validated)                     -> the frozen JobConfig, each section built by its group

Nothing changes a Namespace once it is made: each step returns new values. Every inconsistency is an InputError
that names the flags, their values and the fix, before any process group or model exists.
"""
import argparse
from types import MappingProxyType
from typing import Any, Mapping

from megatron.config.curriculum import seqlen_curriculum
from megatron.config.flags import (activation_checkpointing, checkpointing, common, data, logging_flags, model, moe,
                                   optimizer, parallelism, precision, schedule, stopping, tokenizer, training,
                                   unsupported)
from megatron.config.flags.parallelism import DEEPSPEED_JSON
from megatron.config.job import JobConfig
from megatron.config.model_config import ARCHITECTURE_FLAGS, ModelConfig
from megatron.config.presets import get_preset, preset_names
from megatron.errors import InputError

# Registration order is the order of --help.
_GROUPS = (model, moe, activation_checkpointing, training, schedule, optimizer, precision, data, tokenizer, checkpointing,
           logging_flags, parallelism, stopping, unsupported)
_LIMITS = tuple(group.LIMITS for group in (model, training, schedule, optimizer, precision, data, tokenizer,
                                           checkpointing, logging_flags, parallelism))
_DEFAULTS_AFTER_PRESET = MappingProxyType({
    **parallelism.PRESET_DEFAULTS, **schedule.PRESET_DEFAULTS, **model.PRESET_DEFAULTS,
    **activation_checkpointing.PRESET_DEFAULTS, **training.PRESET_DEFAULTS, **data.PRESET_DEFAULTS,
    **moe.PRESET_DEFAULTS})


def _build_parser() -> argparse.ArgumentParser:
    parser = common.OneLineErrorParser(description="GPT pre-training (Megatron-DeepSpeed flags)", allow_abbrev=False)
    for group in _GROUPS:
        group.add_flags(parser)
    return parser


def model_flag_argv(model: ModelConfig) -> list:
    """The command-line flags that give `model`'s architecture, as a checkpoint records it (a run on that checkpoint
    must repeat them): each valued flag with its value (None: left out, the flag's default), each switch whose value
    is not the default."""
    actions = [action for action in _build_parser()._actions if action.dest in ARCHITECTURE_FLAGS]
    argv = []
    for name in ARCHITECTURE_FLAGS:
        value = getattr(model, name)
        for action in (action for action in actions if action.dest == name):
            if action.nargs != 0 and value is None:
                break
            if action.nargs != 0:
                argv += [action.option_strings[0], str(value)]
                break
            if action.const == value:
                argv.append(action.option_strings[0])
                break
    return argv


def flag_defaults() -> dict:
    """Every flag's default, as a command line without it gets it (the groups' own, then the defaults that apply
    after a preset): what a checkpoint that lacks a flag was trained with."""
    values = vars(_build_parser().parse_args([]))
    values.update({dest: default for dest, default in _DEFAULTS_AFTER_PRESET.items() if values.get(dest) is None})
    return values


def _preset_values(values: Mapping) -> dict:
    """What --model-size fills: each of its values the user did not give (directly or via an alternative)."""
    if values["model_size"] is None:
        return {}
    return {dest: value for dest, value in get_preset(values["model_size"]).items()
            if all(values[name] is None for name in (dest, *schedule.PRESET_ALTERNATIVES.get(dest, ())))}


def command_line_values(parsed: Mapping) -> dict:
    """The parsed flags with upstream's aliases, the preset and the defaults after it applied, and the unsupported
    flags checked and dropped."""
    values = {**parsed, **model.after_parse(parsed), **data.after_parse(parsed)}
    values.update(_preset_values(values))
    values.update({dest: default for dest, default in _DEFAULTS_AFTER_PRESET.items() if values[dest] is None})
    return unsupported.supported(values)


def parse_args(argv=None, extra_args_provider=None) -> argparse.Namespace:
    """Parse flags (sys.argv[1:] when argv is None); `extra_args_provider(parser) -> parser` may add a script's own
    flags. World-size-dependent values are left to validate_args."""
    parser = _build_parser()
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    return argparse.Namespace(**command_line_values(vars(parser.parse_args(argv))))


def resolve(values: Mapping, world_size: int, device_name: str) -> dict:
    """Check the flags against each other, the world size and the device; the values with the derived ones added
    (world_size, data_parallel_size, num_micro_batches, ds_pipeline_enabled, the DeepSpeed JSON ...). Raises
    InputError on the first problem."""
    for limits in _LIMITS:
        common.check_required(values, limits, preset_names())
    common.check_ranges(values, _LIMITS)
    values = {**values, **parallelism.sizes(values, world_size)}
    values.update(model.shape(values))
    values.update(training.batch_sizes(values))
    values.update(parallelism.deepspeed_json(values))
    model.validate(values)
    values.update(training.rampup(values))
    optimizer.validate(values)
    values.update(activation_checkpointing.resolve(values))
    logging_flags.validate(values)
    parallelism.validate_zero(values)
    precision.validate(values, device_name)
    values.update(schedule.lengths(values))
    data.validate(values)
    tokenizer.validate(values)
    values.update(parallelism.features(values))
    _curriculum(values)
    moe.validate(values)
    values.update(parallelism.backend(values, device_name))
    checkpointing.validate(values)
    return values


def _curriculum(values: Mapping):
    """The DeepSpeed JSON's sequence-length curriculum, checked against the sequence length and its split."""
    split = values["tensor_model_parallel_size"] if values["sequence_parallel"] else 1
    curriculum = seqlen_curriculum(values[DEEPSPEED_JSON], values["deepspeed_config"], values["seq_length"], split)
    if curriculum is not None and values["ds_sequence_parallel_size"] > 1:
        raise InputError(f"--deepspeed_config {values['deepspeed_config']} enables a sequence-length curriculum, which "
                         f"cuts whole sequences, but --ds-sequence-parallel-size "
                         f"{values['ds_sequence_parallel_size']} gives each rank a chunk of every sequence; use one "
                         f"of the two")
    return curriculum


def validate_args(args: argparse.Namespace, world_size: int, device_name: str) -> argparse.Namespace:
    """resolve() of the parsed flags, as a new Namespace; `args` itself is not changed."""
    return argparse.Namespace(**resolve(vars(args), world_size, device_name))


def build_job_config(values: Mapping[str, Any]) -> JobConfig:
    """The frozen configuration of values resolve() returned (or of a checkpoint's recorded flags with them)."""
    return JobConfig(
        model=model.section(values),
        moe=moe.section(values),
        activation_checkpointing=activation_checkpointing.section(values),
        parallel=parallelism.section(values),
        batch=training.section(values),
        schedule=schedule.section(values),
        optimizer=optimizer.section(values),
        precision=precision.section(values),
        tokenizer=tokenizer.section(values),
        data=data.section(values),
        checkpoint=checkpointing.section(values),
        logging=logging_flags.section(values),
        stopping=stopping.section(values),
        deepspeed_config=values["deepspeed_config"],
        deepspeed_json=values[DEEPSPEED_JSON],
        flags=MappingProxyType({dest: value for dest, value in values.items() if dest != DEEPSPEED_JSON}),
        curriculum=_curriculum(values),
    )


def job_config(args: argparse.Namespace) -> JobConfig:
    """The frozen configuration of flags validate_args returned."""
    return build_job_config(vars(args))


def with_flags(config: JobConfig, changed: Mapping[str, Any]) -> JobConfig:
    """The job with some flags changed (those adopted from a checkpoint), through the same builders."""
    return build_job_config({**config.flags, **changed, DEEPSPEED_JSON: config.deepspeed_json})
