"""The exception types a run reports to its user, and the command-line wrapper: logging set up once, and
those exceptions (and Ctrl-C) turned into one line and an exit status instead of a traceback."""
import logging
import sys

EXIT_RUN_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


class InputError(ValueError):
    """Bad input from the user (file, flag, value). The message says what is wrong,
    where (file and line, or flag and value), and how to fix it."""


class RunError(RuntimeError):
    """The run could not go on although its input was fine: it diverged, storage failed, a peer rank stopped
    answering. The message says what happened, where, what was kept (the last complete checkpoint) and what
    to do next."""


def require_divisible(what: str, value: int, by: str, divisor: int, fix: str) -> None:
    """The one wording of every "X must divide Y" rule: '{what} {value} is not divisible by {by} {divisor};
    {fix}'."""
    if value % divisor:
        raise InputError(f"{what} {value} is not divisible by {by} {divisor}; {fix}")


def run_cli(main, argv=None):
    """Run a command-line `main(argv)`: the library's log records (logger "megatron") go to stdout as plain
    lines; an InputError (exit 2), a RunError (exit 1) or Ctrl-C (exit 130) is reported as one line
    `error: ...` on stderr instead of a traceback."""
    logging.basicConfig(format="%(message)s", stream=sys.stdout)
    logging.getLogger("megatron").setLevel(logging.INFO)
    try:
        return main(argv)
    except InputError as err:
        _exit_with(err, EXIT_BAD_INPUT)
    except RunError as err:
        _exit_with(err, EXIT_RUN_FAILED)
    except KeyboardInterrupt:
        _exit_with("interrupted (Ctrl-C)", EXIT_INTERRUPTED)


def _exit_with(message, status: int):
    sys.stdout.flush()
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)
