"""torch.profiler around chosen iterations (megatron/training/profiler.py): the profiler steps on each logged
iteration line, so the tables and the trace cover the asked-for iterations; too short a run is one line and leaves
no output directory. A stand-in for pretrain logs the lines; a real run: tests/tools/test_profile_training.py."""
import json
import logging
import os

import pytest
import torch

from megatron.errors import InputError
from megatron.training.log_lines import iteration_line
from megatron.training.profiler import profile_training


def logging_run(iterations: int):
    """A pretrain stand-in: per iteration a matrix product, then Megatron's iteration line on the library's logger."""
    def pretrain(argv):
        log = logging.getLogger("megatron.training.loop")
        for iteration in range(1, iterations + 1):
            torch.mm(torch.ones(8, 8), torch.ones(8, 8))
            log.info(iteration_line(iteration, iterations, 4 * iteration, 10.0, 1e-4, 4, 2.0, 1.0, 0.5, 0, 0,
                                    40.0, 0.0))
    return pretrain


@pytest.fixture(autouse=True)
def library_logs_info(caplog):
    caplog.set_level(logging.INFO, logger="megatron")  # as run_cli sets it


def test_the_window_is_recorded_into_a_new_directory(tmp_path):
    out = tmp_path / "profile"
    tables = profile_training(logging_run(4), [], warmup_iterations=1, active_iterations=2, output_dir=str(out))
    assert "aten::mm" in tables
    assert sorted(os.listdir(out)) == ["operators.txt", "trace.json"]
    assert (out / "operators.txt").read_text() == tables + "\n"
    trace = json.loads((out / "trace.json").read_text())
    assert sum(event.get("name") == "aten::mm" for event in trace["traceEvents"]) == 2  # the two active iterations


def test_a_run_shorter_than_the_window_is_one_line_and_writes_nothing(tmp_path):
    with pytest.raises(InputError, match="the run logged 2 iterations, fewer than the 3 of --warmup and --active"):
        profile_training(logging_run(2), [], warmup_iterations=1, active_iterations=2, output_dir=str(tmp_path / "p"))
    assert os.listdir(tmp_path) == []
