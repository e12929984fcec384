"""A job that succeeded exits 0: run_cli ends the process groups before the interpreter's teardown, where a gloo
worker thread releasing finished work would otherwise abort the process (megatron/launched_rank.py)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from tests.helpers.distributed import free_port
from tests.helpers.paths import PACKAGE_ROOT
from tests.helpers.training import TINY_FLAGS

from megatron.errors import run_cli

ROOT = PACKAGE_ROOT
# Runs per entry point, the session's shared training the first of its. The test above fails on the old exit path
# every time, so the suite runs each entry point once, to check that it ends clean; EXIT_TEST_REPEATS=40 soaks them
# (80 runs miss an abort of 1 run in 25 with probability 0.96**80, 4 in 100; about 20 minutes on 2 cores).
REPEATS = int(os.environ.get("EXIT_TEST_REPEATS", "1"))


def test_a_command_that_succeeded_leaves_no_process_group_to_the_interpreters_teardown():
    def main(argv):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        dist.all_reduce(torch.ones(2), group=dist.new_group([0]))
        return "done"

    assert run_cli(main) == "done"
    assert not dist.is_initialized()


def torchrun(script: str, *flags: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, environment.get("PYTHONPATH")]))  # tools/ too
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                           os.path.join(ROOT, script), *flags], capture_output=True, text=True, cwd=ROOT,
                          env=environment, timeout=600)


@pytest.mark.full  # 2 x REPEATS four-rank runs, the session's shared training included
def test_four_rank_generation_and_training_exit_0_every_time(shared_full_run, data_prefix):
    run_dir, _ = shared_full_run  # train_full_8p.sh's four ranks under torchrun, which exited 0 (conftest.py)
    generation = ["--load", str(run_dir / "checkpoints"), "--tensor-model-parallel-size", "2", "--prompt", "1 2 3",
                  "--prompt", "7 8", "--max-new-tokens", "4", "--greedy"]
    training = [*TINY_FLAGS, "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2",
                "--eval-iters", "0", "--data-path", data_prefix, "--tensor-model-parallel-size", "2",
                "--no-pipeline-parallel"]
    runs = [("tools/generate_text.py", generation)] * REPEATS + [("pretrain_gpt.py", training)] * (REPEATS - 1)
    for script, flags in runs:
        finished = torchrun(script, *flags)
        assert finished.returncode == 0, f"{script}: {finished.stderr[-3000:]}"
