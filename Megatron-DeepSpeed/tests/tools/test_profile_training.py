"""tools/profile_training.py: torch.profiler around whole iterations of a real run, tables and trace written."""
import json
import os
import subprocess
import sys

import pytest
from tests.helpers.paths import TOOLS

TOOL = os.path.join(TOOLS, "profile_training.py")
FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "5", "--mock-data", "--tokenizer-type",
         "NullTokenizer", "--vocab-size", "128", "--no-pipeline-parallel", "--eval-iters", "0"]


def profile(output_dir, *options):
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, TOOL, "--output-dir", str(output_dir), *options, "--", *FLAGS],
                          capture_output=True, text=True, timeout=600, env={**environment, "DS_ACCELERATOR": "cpu"})


@pytest.mark.full  # a training run
def test_recorded_window_is_whole_iterations_after_warm_up(tmp_path):
    tmp_path = tmp_path / "profile"
    done = profile(tmp_path, "--warmup", "2", "--active", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    operators = (tmp_path / "operators.txt").read_text()
    assert "aten::addmm" in operators and "ProfilerStep" in operators
    steps = [event for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
             if str(event.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == 2  # exactly the active iterations


@pytest.mark.full  # a training run
def test_a_window_past_the_run_is_one_line_and_leaves_no_directory(tmp_path):
    done = profile(tmp_path / "profile", "--warmup", "4", "--active", "2")  # the run trains 5 iterations
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: the run logged 5 iterations, fewer than the 6 of")
    assert "Traceback" not in done.stderr and not (tmp_path / "profile").exists()


def test_an_existing_output_directory_is_refused_untouched(tmp_path):
    (tmp_path / "operators.txt").write_text("the user's")
    done = profile(tmp_path)
    assert done.returncode == 2 and "already exists" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "operators.txt").read_text() == "the user's"
