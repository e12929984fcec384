"""What a rank is waiting for: a heartbeat line while one phase of the run lasts long, and a one-line
RunError naming that phase when a collective gives up on a peer.

A frozen or dead rank leaves its peers blocked inside a collective. The process groups' timeout
(--distributed-timeout-minutes) ends that wait with an exception from the communication library
("Timed out waiting 600000ms for recv operation", "Connection closed by peer"); `Watchdog.phase` turns it
into a message saying which rank waited, in which phase of which iteration, and for how long. Until then the
heartbeat thread logs every `interval` seconds that the rank is still waiting, so a hung job is visible in
its log instead of silent.

Not every group honours that timeout: DeepSpeed creates its pipeline groups itself, with torch's default
(30 minutes on gloo). So a phase that should never outlast it (a training iteration) has a deadline too:
past the timeout and a grace, the heartbeat thread reports the hang in one line and ends the process, as
NCCL's own watchdog does, and the launcher then stops the other ranks.
"""
import contextlib
import logging
import os
import sys
import threading
import time
from typing import Optional

import torch.distributed as dist

from megatron.errors import EXIT_RUN_FAILED, RunError

_log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 60.0
_PEER_FAILURE_MARKERS = ("timed out", "timeout", "connection closed", "connection reset", "pair closure",
                         "broken pipe")


def heartbeat_interval(timeout_minutes: float) -> float:
    """A line every minute, or four times within the timeout when that is shorter."""
    return min(HEARTBEAT_SECONDS, timeout_minutes * 60.0 / 4)


def deadline_seconds(timeout_minutes: float) -> float:
    """How long a phase with a deadline may last: half as long again as the timeout, so that a collective's
    own timeout fires first where it can."""
    return timeout_minutes * 60.0 * 1.5 + 1.0


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that gave up on another rank (not a bug of this one)."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(marker in text for marker in _PEER_FAILURE_MARKERS)


class Watchdog:
    """Tracks the phase this rank is in; see the module docstring."""

    def __init__(self, rank: int, timeout_minutes: float, interval: Optional[float] = None):
        self.rank, self.timeout_minutes = rank, timeout_minutes
        self.interval = interval or heartbeat_interval(timeout_minutes)
        self._current: Optional[tuple[str, float, bool]] = None  # (phase, start, has a deadline), set whole
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def phase(self, what: str, deadline: bool = False):
        """Run the body as phase `what`; with `deadline`, it must end within deadline_seconds()."""
        started = time.monotonic()
        self._current = (what, started, deadline)
        try:
            yield
        except RuntimeError as err:
            if not is_peer_failure(err):
                raise
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RunError(f"rank {self.rank}: {what} stopped after waiting {time.monotonic() - started:.0f} s for "
                           f"the other ranks ({first_line}); another rank died or froze (see its messages above), "
                           f"--distributed-timeout-minutes is {self.timeout_minutes:g}") from err
        finally:
            self._current = None

    def _beat(self) -> None:
        reported, next_report = None, 0.0
        while not self._stopped.wait(min(1.0, self.interval / 4)):
            current, now = self._current, time.monotonic()
            if current is None:
                continue
            what, started, deadline = current
            if current != reported:
                reported, next_report = current, started + self.interval
            if deadline and now - started > deadline_seconds(self.timeout_minutes):
                self._end_process(what, now - started)
            if now >= next_report:
                next_report += self.interval
                _log.info(f"rank {self.rank}: still in {what} after {now - started:.0f} s (waiting for data or for "
                          f"the other ranks in a collective)")

    def _end_process(self, what: str, waited: float) -> None:
        sys.stdout.flush()
        message = (f"error: rank {self.rank}: {what} has waited {waited:.0f} s, longer than "
                   f"--distributed-timeout-minutes {self.timeout_minutes:g}: another rank died or froze (see its "
                   f"messages above); stopping this rank\n")
        os.write(sys.stderr.fileno(), message.encode())
        os._exit(EXIT_RUN_FAILED)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join()
