"""Requests to end a run early but cleanly, as batch schedulers expect: SIGTERM with --exit-signal-handler,
and --exit-duration-in-mins (upstream's flags). The run finishes its iteration, saves a checkpoint and exits
0, so the job can be resubmitted with --load. Every rank must stop at the same iteration, so the requests
each rank has seen are all-reduced after every iteration."""
import logging
import signal
import time
from typing import Optional

import torch
import torch.distributed as dist

from megatron import device

_log = logging.getLogger(__name__)


class ExitRequests:
    def __init__(self, on_sigterm: bool, duration_minutes: Optional[float], started: float):
        self.on_sigterm, self.duration_minutes, self.started = on_sigterm, duration_minutes, started
        self.signalled = False
        self._previous_handler = signal.signal(signal.SIGTERM, self._note_signal) if on_sigterm else None

    def _note_signal(self, signum, frame) -> None:
        self.signalled = True

    def reason(self) -> Optional[str]:
        """Why the run should stop after this iteration (the same answer on every rank), or None."""
        if not (self.on_sigterm or self.duration_minutes):
            return None
        overdue = bool(self.duration_minutes) and time.monotonic() - self.started >= self.duration_minutes * 60
        seen = torch.tensor([float(self.signalled), float(overdue)], device=device.current_device())
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        if seen[0]:
            return "SIGTERM received (--exit-signal-handler)"
        if seen[1]:
            return f"--exit-duration-in-mins {self.duration_minutes:g} reached"
        return None

    def close(self) -> None:
        """Give SIGTERM back its previous meaning."""
        if self.on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_handler)
