"""A multi-process job's output as its user should see it: one failure reported once.

When one rank fails, every rank of the job reacts: the failing one prints its `error: ...` line (or a
traceback), its peers fail in their collectives with tracebacks of their own, and torchrun adds a
ChildFailedError report. The launcher keeps all of that in the job's log, but the terminal shows the output
only up to the first failure, and then the first failing rank's one-line message once.
"""
import re
from typing import Optional

ERROR_PREFIX = "error: "
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torch's "[rank3]: " before a rank's traceback
_TRACEBACK = "Traceback (most recent call last):"


class FirstFailure:
    """Reads a job's merged output line by line (`show(line)`), and keeps the first failure's message."""

    def __init__(self):
        self.error_line: Optional[str] = None  # the first `error: ...` message
        self.exception_line: Optional[str] = None  # else the last line of the first traceback
        self._in_traceback = False

    @property
    def failed(self) -> bool:
        return self.error_line is not None or self._in_traceback or self.exception_line is not None

    @property
    def message(self) -> Optional[str]:
        return self.error_line or self.exception_line

    def show(self, line: str) -> bool:
        """Whether the terminal should show `line` (the log keeps every line)."""
        shown = not self.failed
        text = _RANK_PREFIX.sub("", line.rstrip("\n"))
        if text.startswith(ERROR_PREFIX) and self.error_line is None:
            self.error_line = text[len(ERROR_PREFIX):]
        elif text.startswith(_TRACEBACK) and self.exception_line is None:
            self._in_traceback = True
        elif self._in_traceback and text and not text[0].isspace():
            self.exception_line, self._in_traceback = text, False
        return shown and not self.failed
