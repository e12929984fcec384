"""Training-length and learning-rate flags (iterations, samples or tokens; Megatron's warmup and decay); their
checks and defaults, and the ScheduleConfig section."""
from typing import Mapping

from megatron.config.flags.common import Limits, after_preset, describe, flag, given, same_named
from megatron.config.job import ScheduleConfig
from megatron.config.learning_rates import DECAY_STYLES, schedule_samples
from megatron.errors import InputError

LIMITS = Limits(required=("lr",), positive=("train_iters", "train_samples", "lr_decay_iters", "lr_decay_samples"),
                non_negative=("lr", "min_lr", "lr_warmup_iters", "lr_warmup_samples", "lr_warmup_fraction"))
PRESET_DEFAULTS = {"min_lr": 0.0, "lr_decay_style": "linear"}
# A preset value is skipped when the user chose one of its alternatives (they exclude each other).
PRESET_ALTERNATIVES = {
    "train_iters": ("train_samples",),
    "lr_decay_iters": ("lr_decay_samples", "train_samples"),
    "lr_warmup_fraction": ("lr_warmup_iters", "lr_warmup_samples"),
}


def add_flags(parser) -> None:
    length = parser.add_argument_group("training length")
    length.add_argument("--train-iters", type=int, help="Iterations to train (or --train-samples).")
    length.add_argument("--train-samples", type=int, help="Samples to train (or --train-iters).")
    length.add_argument("--train-tokens", type=int,
                        help="Also stop once this many tokens (samples x --seq-length) have been consumed.")
    group = parser.add_argument_group("learning rate")
    group.add_argument("--lr", type=float, help="Peak learning rate.")
    group.add_argument("--min-lr", type=float,
                       help="Learning rate floor of the decay. " + after_preset(PRESET_DEFAULTS["min_lr"]))
    group.add_argument("--lr-decay-style", choices=DECAY_STYLES, help=after_preset(PRESET_DEFAULTS["lr_decay_style"]))
    group.add_argument("--lr-decay-iters", type=int,
                       help="Iterations to decay over. Default --train-iters.")
    group.add_argument("--lr-decay-samples", type=int,
                       help="Samples to decay over. Default --train-samples.")
    group.add_argument("--lr-decay-tokens", type=int,
                       help="Decay the learning rate over this many tokens (overrides the iteration/sample "
                            "decay length).")
    group.add_argument("--lr-warmup-fraction", type=float,
                       help="Warmup as a fraction of the decay length.")
    group.add_argument("--lr-warmup-iters", type=int, help="Warmup length in iterations.")
    group.add_argument("--lr-warmup-samples", type=int, help="Warmup length in samples.")
    group.add_argument("--lr-warmup-tokens", type=int, help="Warm the learning rate up over this many tokens.")


def _check_tokens(values: Mapping) -> None:
    for dest in ("train_tokens", "lr_decay_tokens", "lr_warmup_tokens"):
        if values[dest] is not None and values[dest] < 0:
            raise InputError(f"{flag(dest)} {values[dest]} must be 0 or more")
    decay, warmup = values["lr_decay_tokens"], values["lr_warmup_tokens"]
    if decay is not None and decay <= (warmup or 0):
        raise InputError(f"--lr-decay-tokens {decay} must be longer than --lr-warmup-tokens "
                         f"{warmup or 0}: the decay starts where the warmup ends")


def lengths(values: Mapping) -> dict:
    """Exactly one training length; the decay length it defaults, and warmups that fit in the decay."""
    _check_tokens(values)
    length = given(values, "train_iters", "train_samples")
    if len(length) != 1:
        got = f"both {describe(values, length)} were given" if length else "neither was given"
        raise InputError(f"give exactly one of --train-iters or --train-samples; {got}")
    warmups = given(values, "lr_warmup_fraction", "lr_warmup_iters", "lr_warmup_samples")
    if len(warmups) > 1:
        raise InputError(f"give at most one LR warmup, but {describe(values, warmups)} were given")
    unit, other = ("iters", "samples") if values["train_iters"] is not None else ("samples", "iters")
    mismatched = given(values, f"lr_decay_{other}", f"lr_warmup_{other}")
    if mismatched:
        raise InputError(
            f"{describe(values, mismatched)} counts {other}, but training length is "
            f"{describe(values, length)}; use --lr-decay-{unit} / --lr-warmup-{unit} instead")
    decay_dest = f"lr_decay_{unit}"
    decay = values[decay_dest] if values[decay_dest] is not None else values[f"train_{unit}"]
    fraction = values["lr_warmup_fraction"]
    if fraction is not None and fraction > 1:
        raise InputError(f"--lr-warmup-fraction {fraction} makes the warmup "
                         f"longer than the LR decay; use a fraction between 0 and 1")
    warmup = values[f"lr_warmup_{unit}"]
    if warmup is not None and warmup > decay:
        raise InputError(
            f"--lr-warmup-{unit} {warmup} is longer than the LR decay ({flag(decay_dest)} {decay}"
            f", which defaults to --train-{unit}); shorten the warmup or lengthen the decay")
    if values["lr"] < values["min_lr"]:
        raise InputError(f"--lr {values['lr']} is below --min-lr {values['min_lr']}; the peak learning "
                         f"rate must be at least the floor")
    return {decay_dest: decay, "lr_warmup_iters": values["lr_warmup_iters"] or 0,
            "lr_warmup_samples": values["lr_warmup_samples"] or 0}


def section(values: Mapping) -> ScheduleConfig:
    warmup_samples, decay_samples = schedule_samples(values)
    return same_named(ScheduleConfig, values, decay_style=values["lr_decay_style"], warmup_samples=warmup_samples,
                      decay_samples=decay_samples, tokens_per_sample=values["seq_length"],
                      warmup_tokens=values["lr_warmup_tokens"], decay_tokens=values["lr_decay_tokens"])
