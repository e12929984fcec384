"""The one exception type for bad user input, and the command-line wrapper: logging set up once, and an
InputError turned into a clean exit."""
import logging
import sys


class InputError(ValueError):
    """Bad input from the user (file, flag, value). The message says what is wrong,
    where (file and line, or flag and value), and how to fix it."""


def require_divisible(what: str, value: int, by: str, divisor: int, fix: str) -> None:
    """The one wording of every "X must divide Y" rule: '{what} {value} is not divisible by {by} {divisor};
    {fix}'."""
    if value % divisor:
        raise InputError(f"{what} {value} is not divisible by {by} {divisor}; {fix}")


def run_cli(main, argv=None):
    """Run a command-line `main(argv)`: the library's log records (logger "megatron") go to stdout as plain
    lines, and an InputError is reported as one line on stderr with exit 2 instead of a traceback."""
    logging.basicConfig(format="%(message)s", stream=sys.stdout)
    logging.getLogger("megatron").setLevel(logging.INFO)
    try:
        return main(argv)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
