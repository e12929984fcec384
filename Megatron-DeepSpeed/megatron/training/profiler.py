"""Where a training iteration's time goes: torch.profiler around chosen iterations of a real run.

The profiler steps when the trainer logs an iteration line (--log-interval 1), so the recorded window is
exactly whole iterations after a warm-up, with no hook inside the training loop.
"""
import logging
import os
from typing import Callable, Sequence

import torch

from megatron import device
from megatron.errors import InputError
from megatron.files.atomic import write_directory_atomically
from megatron.training.log_lines import parse_log


class _StepOnIterationLines(logging.Handler):
    def __init__(self, profiler):
        super().__init__()
        self.profiler = profiler
        self.iterations = 0

    def emit(self, record: logging.LogRecord) -> None:
        if parse_log(record.getMessage()).iterations:
            self.profiler.step()
            self.iterations += 1


def profile_training(pretrain: Callable, argv: Sequence[str], warmup_iterations: int, active_iterations: int,
                     output_dir: str, rows: int = 30) -> str:
    """Train with `argv` (which must log every iteration and train warmup + active iterations or more),
    recording iterations warmup+1 .. warmup+active. Writes the operator tables (by device time and by host time,
    operators.txt) and a Chrome trace (trace.json) into `output_dir`, which must not exist yet and appears only
    complete; returns the tables."""
    schedule = torch.profiler.schedule(wait=max(warmup_iterations - 1, 0), warmup=min(warmup_iterations, 1),
                                       active=active_iterations, repeat=1)
    device_sort = "self_device_time_total" if len(device.profiler_activities()) > 1 else "self_cpu_time_total"
    tables = []

    def record(directory: str) -> None:
        def on_trace_ready(profiler):
            averages = profiler.key_averages()
            tables.extend(averages.table(sort_by=key, row_limit=rows) for key in (device_sort, "self_cpu_time_total"))
            profiler.export_chrome_trace(os.path.join(directory, "trace.json"))

        ours = logging.getLogger("megatron")
        with torch.profiler.profile(activities=device.profiler_activities(), schedule=schedule,
                                    on_trace_ready=on_trace_ready) as profiler:
            handler = _StepOnIterationLines(profiler)
            ours.addHandler(handler)
            try:
                pretrain(list(argv))
            finally:
                ours.removeHandler(handler)
        if handler.iterations < warmup_iterations + active_iterations:  # the window would hold less than asked
            raise InputError(f"the run logged {handler.iterations} iterations, fewer than the "
                             f"{warmup_iterations + active_iterations} of --warmup and --active; raise --train-iters "
                             "or lower --warmup / --active, and keep --log-interval 1")
        with open(os.path.join(directory, "operators.txt"), "w") as out:
            out.write("\n\n".join(tables) + "\n")

    write_directory_atomically(output_dir, record)
    return "\n\n".join(tables)
