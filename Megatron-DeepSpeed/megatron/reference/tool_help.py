"""A command-line tool's --help text, produced by running the tool's own code in this process (as
`python TOOL --help` would, at a fixed width so the text does not depend on the terminal). Every tool has a
`main()` that parses sys.argv when called without arguments."""
import contextlib
import io
import os
import runpy
import sys

HELP_WIDTH = 110


@contextlib.contextmanager
def _command_line(argv: list, columns: int):
    """sys.argv and COLUMNS (argparse's width) as for `argv` typed in a terminal that wide, then restored."""
    saved_argv, saved_columns = sys.argv, os.environ.get("COLUMNS")
    sys.argv, os.environ["COLUMNS"] = argv, str(columns)
    try:
        yield
    finally:
        sys.argv = saved_argv
        if saved_columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved_columns


def help_text(script: str) -> str:
    """What `python SCRIPT --help` prints: the script's `main()` with that command line, its output caught. The
    module is loaded first, outside the capture, so that what its imports set up (loggers bound to stdout) keeps
    writing to the real stdout."""
    main = runpy.run_path(script, run_name="tool_help")["main"]
    out = io.StringIO()
    with _command_line([script, "--help"], HELP_WIDTH), contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise RuntimeError(f"{script} --help exited with {stop.code}") from None
    return out.getvalue().rstrip() + "\n"
