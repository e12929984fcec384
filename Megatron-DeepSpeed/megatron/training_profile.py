"""Where a training iteration's time goes: torch.profiler around chosen iterations of a real run.

The profiler steps when the trainer logs an iteration line (--log-interval 1), so the recorded window is
exactly whole iterations after a warm-up, with no hook inside the training loop.
"""
import logging
import os
from typing import Callable, Sequence

import torch

from megatron import device


class _StepOnIterationLines(logging.Handler):
    def __init__(self, profiler):
        super().__init__()
        self.profiler = profiler

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().lstrip().startswith("iteration "):
            self.profiler.step()


def profile_training(pretrain: Callable, argv: Sequence[str], warmup_iterations: int, active_iterations: int,
                     output_dir: str, rows: int = 30) -> str:
    """Train with `argv` (which must log every iteration and train warmup + active iterations or more),
    recording iterations warmup+1 .. warmup+active. Writes the operator tables (by device time and by host time)
    and a Chrome trace into `output_dir`; returns the tables."""
    os.makedirs(output_dir, exist_ok=True)
    schedule = torch.profiler.schedule(wait=max(warmup_iterations - 1, 0), warmup=min(warmup_iterations, 1),
                                       active=active_iterations, repeat=1)
    tables = []

    def on_trace_ready(profiler):
        averages = profiler.key_averages()
        device_sort = "self_device_time_total" if len(device.profiler_activities()) > 1 else "self_cpu_time_total"
        tables.append(averages.table(sort_by=device_sort, row_limit=rows))
        tables.append(averages.table(sort_by="self_cpu_time_total", row_limit=rows))
        profiler.export_chrome_trace(os.path.join(output_dir, "trace.json"))

    ours = logging.getLogger("megatron")
    with torch.profiler.profile(activities=device.profiler_activities(), schedule=schedule,
                                on_trace_ready=on_trace_ready) as profiler:
        handler = _StepOnIterationLines(profiler)
        ours.addHandler(handler)
        try:
            pretrain(list(argv))
        finally:
            ours.removeHandler(handler)
    text = "\n\n".join(tables)
    with open(os.path.join(output_dir, "operators.txt"), "w") as out:
        out.write(text + "\n")
    return text
