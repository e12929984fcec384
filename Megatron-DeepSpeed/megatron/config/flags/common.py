"""What every flag group shares: the flag's spelling and the range rules in messages (one wording for all), the
argparse pieces (a parser whose errors are one line, numbers with a lower bound), and building a config section
from the same-named values."""
import argparse
from dataclasses import dataclass
from typing import Mapping, Sequence

from megatron.errors import InputError


def flag(dest: str) -> str:
    """The command-line spelling of an argparse attribute, for messages."""
    return "--" + dest.replace("_", "-")


def after_preset(default) -> str:
    """Help text of a flag that --model-size may fill (argparse default None, so 'not given' stays visible)."""
    return f"Default {default!r}; --model-size may set it."


@dataclass(frozen=True)
class Limits:
    """A group's value rules checked before anything else: flags that must be given, and numeric ranges (a flag
    left at None is not checked)."""
    required: Sequence[str] = ()
    positive: Sequence[str] = ()
    non_negative: Sequence[str] = ()
    fractions: Sequence[str] = ()  # in [0, 1)


def check_required(values: Mapping, limits: Limits, preset_names: Sequence[str]) -> None:
    for dest in limits.required:
        if values[dest] is None:
            raise InputError(f"{flag(dest)} is required: give it, or --model-size NAME "
                             f"(one of {', '.join(preset_names)}) to take it from a preset")


_RULES = (("positive", lambda v: v > 0, "greater than 0"),
          ("non_negative", lambda v: v >= 0, "0 or more"),
          ("fractions", lambda v: 0 <= v < 1, "in [0, 1)"))


def check_ranges(values: Mapping, all_limits: Sequence[Limits]) -> None:
    """Every positive rule of every group first, then the non-negative ones, then the fractions."""
    for field, ok, wanted in _RULES:
        for limits in all_limits:
            for dest in getattr(limits, field):
                value = values[dest]
                if value is not None and not ok(value):
                    raise InputError(f"{flag(dest)} {value} is out of range: it must be {wanted}")


def given(values: Mapping, *dests: str) -> list:
    """The flags among dests that were set; 0 counts as unset, like Megatron's warmup defaults."""
    return [dest for dest in dests if values[dest] not in (None, 0)]


def describe(values: Mapping, dests: Sequence[str]) -> str:
    return " and ".join(f"{flag(dest)} {values[dest]}" for dest in dests)


class OneLineErrorParser(argparse.ArgumentParser):
    """A malformed command line is an InputError (one line, exit 2 through run_cli), not a usage dump."""

    def error(self, message):
        raise InputError(f"{message} (see {self.prog} --help)")


def number_above(minimum, kind):
    """argparse type: a `kind` number greater than `minimum`."""
    def parse(text):
        value = kind(text)
        if not value > minimum:
            raise argparse.ArgumentTypeError(f"{text} must be greater than {minimum}")
        return value
    return parse


def same_named(cls, values: Mapping, **renamed):
    """The dataclass cls built from the same-named values; `renamed` gives the fields whose flag differs."""
    return cls(**{name: values[name] for name in cls.__dataclass_fields__ if name not in renamed}, **renamed)
