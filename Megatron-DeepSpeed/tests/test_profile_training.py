"""tools/profile_training.py: torch.profiler around whole iterations of a real run, tables and trace written."""
import json
import os
import subprocess
import sys

import pytest

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "profile_training.py")
FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "5", "--mock-data", "--tokenizer-type",
         "NullTokenizer", "--vocab-size", "128", "--no-pipeline-parallel", "--eval-iters", "0"]


@pytest.mark.full  # a training run
def test_recorded_window_is_whole_iterations_after_warm_up(tmp_path):
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, TOOL, "--output-dir", str(tmp_path), "--warmup", "2", "--active", "2",
                           "--", *FLAGS], capture_output=True, text=True, timeout=600,
                          env={**environment, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    operators = (tmp_path / "operators.txt").read_text()
    assert "aten::addmm" in operators and "ProfilerStep" in operators
    steps = [event for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
             if str(event.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == 2  # exactly the active iterations
