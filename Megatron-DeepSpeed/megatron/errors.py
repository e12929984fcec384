"""The exception types a run reports to its user, and the command-line wrapper: logging set up once, and
those exceptions (and Ctrl-C) turned into one line and an exit status instead of a traceback."""
import hashlib
import logging
import os
import sys
import tempfile

from megatron.launched_rank import end_with_launcher, leave_process_groups

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
    `error: ...` on stderr instead of a traceback. A rank a launcher started ends with that launcher, and one
    that succeeded ends its process groups before the interpreter's teardown (megatron/launched_rank.py)."""
    end_with_launcher()
    logging.basicConfig(format="%(message)s", stream=sys.stdout)
    logging.getLogger("megatron").setLevel(logging.INFO)
    try:
        result = main(argv)
    except InputError as err:
        _exit_with(err, EXIT_BAD_INPUT)
    except RunError as err:
        _exit_with(err, EXIT_RUN_FAILED)
    except KeyboardInterrupt:
        _exit_with("interrupted (Ctrl-C)", EXIT_INTERRUPTED)
    leave_process_groups()
    return result


def _exit_with(message, status: int):
    sys.stdout.flush()
    if _first_to_report(str(message)):
        print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def _first_to_report(message: str) -> bool:
    """Whether this process is the first of its launch to report `message`. Under torchrun or the deepspeed
    launcher every rank of a node usually fails alike (a flag each one validates) and would print the same line
    N times. The ranks are children of one launcher process, so a marker file named after that process (its pid
    and start time, unique on the host) and the message lets only the first say it; a message no other rank
    has is always said."""
    if int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))) <= 1:
        return True
    try:
        with open(f"/proc/{os.getppid()}/stat", encoding="ascii") as stat:
            launcher_start = stat.read().rsplit(")", 1)[1].split()[19]  # field 22: start time after boot
        key = hashlib.sha256(f"{os.getppid()} {launcher_start} {message}".encode()).hexdigest()[:24]
        os.close(os.open(os.path.join(tempfile.gettempdir(), f"megatron-error-{key}"),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except (OSError, IndexError):  # no /proc (not Linux) or no writable temp dir: say it, perhaps more than once
        return True
    return True
