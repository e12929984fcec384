"""Megatron-DeepSpeed's flags beyond the core set of megatron/config/arguments.py, one module per group, plus the
upstream flags deliberately not supported (unsupported.py, as data). megatron.config.arguments registers them all and
calls these hooks, so parse_args / validate_args stay the only entry points."""
from megatron.config.flags import (activation_checkpointing, checkpoint_loading, data, logging_flags, model, training,
                                   unsupported, zero)

_GROUPS = (model, training, data, activation_checkpointing, logging_flags, zero, checkpoint_loading, unsupported)


def add_flags(parser) -> None:
    for group in _GROUPS:
        group.add_flags(parser)


def after_parse(args) -> None:
    """Aliases and defaults that need only the command line; before --model-size fills the gaps."""
    model.after_parse(args)
    data.after_parse(args)


def reject_unsupported(args) -> None:
    """One-line InputError for a flag that turns on a feature this trainer lacks; after --model-size."""
    unsupported.reject_unsupported(args)


def validate(args) -> None:
    """Checks that need the world size and batch sizes (called by validate_args); settles --zero-stage first."""
    zero.resolve_zero_stage(args)
    for group in (model, training, activation_checkpointing, logging_flags, zero):
        group.validate(args)
