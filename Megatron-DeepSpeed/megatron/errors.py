"""The one exception type for bad user input, and the wrapper that turns it into a clean exit."""
import sys


class InputError(ValueError):
    """Bad input from the user (file, flag, value). The message says what is wrong,
    where (file and line, or flag and value), and how to fix it."""


def run_cli(main, argv=None):
    """Run a command-line `main(argv)`; report an InputError as one line on stderr and exit 2
    instead of printing a traceback."""
    try:
        return main(argv)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
