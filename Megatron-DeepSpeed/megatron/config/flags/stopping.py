"""Flags for runs that stop early (divergence, SIGTERM, a time limit) and for hangs (a peer that stops
answering); the StoppingConfig section. Generation and evaluation share the timeout flag."""
from typing import Mapping

from megatron.config.flags.common import number_above, same_named
from megatron.config.job import StoppingConfig


def add_flags(parser) -> None:
    group = parser.add_argument_group("stopping early and hangs")
    group.add_argument("--max-consecutive-nan-iterations", type=number_above(0, int), default=10,
                       help="Stop a diverged run (exit 1) after this many iterations in a row whose loss or "
                            "gradient norm is not finite; their updates are skipped.")
    group.add_argument("--exit-signal-handler", action="store_true",
                       help="On SIGTERM, save a checkpoint after the current iteration and exit 0 (SIGINT, as Ctrl-C "
                            "sends, stops at once without one).")
    group.add_argument("--exit-duration-in-mins", type=number_above(0, float),
                       help="Save a checkpoint and exit 0 once the run has lasted this many minutes.")
    add_timeout_flag(group)


def add_timeout_flag(group) -> None:
    group.add_argument("--distributed-timeout-minutes", type=number_above(0, float), default=10.0,
                       help="A collective that waits longer than this for a peer rank ends the run.")


def section(values: Mapping) -> StoppingConfig:
    return same_named(StoppingConfig, values)
