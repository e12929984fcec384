"""Multi-node launch on one machine: two node launchers of test/train_full_8p.sh (2 processes each, TP2 x PP2
across the nodes) against the same job on one node of 4 processes, and the deepspeed launcher's hostfile mode
without ssh."""
import json
import os
import shlex
import subprocess
import sys

import pytest

from megatron.training.log_lines import parse_log
from tests.helpers.distributed import free_port
from tests.helpers.entry_scripts import SHARED_RUN_ITERS, finish, quiet_environment, start_full_run
from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.full  # whole runs of the entry script: the full tier

REPO = REPO_ROOT


def losses(log_path):
    with open(log_path, encoding="utf-8") as log:
        return [record.lm_loss for record in parse_log(log).iterations]


@pytest.fixture(scope="module")
def one_node(shared_full_run):
    """The reference: the same job on one node of 4 processes, the session's shared run (conftest.py)."""
    run_dir, output = shared_full_run
    assert output.strip().splitlines()[-3].startswith("Final Performance samples/sec : ")
    assert "Memory estimate (tools/plan_layout.py): " in output  # the planner's figures for this layout
    reference = losses(run_dir / "train.log")
    assert len(reference) == SHARED_RUN_ITERS
    return run_dir, reference


def test_two_node_launchers_train_as_one_node(one_node, tmp_path):
    port = free_port()
    nodes = [start_full_run("--nproc=2", "--nnodes=2", f"--node_rank={rank}", "--master_addr=127.0.0.1",
                            f"--master_port={port}", f"--output_dir={tmp_path}") for rank in (0, 1)]
    first, last = [finish(node) for node in nodes]
    # Node 1 holds the logging rank 3: it prints the summary; node 0 says where it is and exits 0.
    assert last.strip().splitlines()[-3].startswith("Final Performance samples/sec : ")
    assert "Final Performance" not in first
    assert "The summary is on node 1 (node_rank=1), which holds the logging rank 3" in first
    assert {"train.log", "train.node0.log", "run.json"} <= set(os.listdir(tmp_path))
    assert losses(tmp_path / "train.log") == one_node[1]
    # Both nodes' ranks wrote the checkpoint into the shared run directory.
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == f"global_step{SHARED_RUN_ITERS}"


def test_deepspeed_launcher_hostfile_without_ssh(one_node, tmp_path):
    """`deepspeed --hostfile H --no_ssh --node_rank=I`: each node starts its own ranks (no ssh), with the very
    pretrain_gpt.py flags of the one-node run."""
    run_dir, reference = one_node
    command = shlex.split(json.loads((run_dir / "run.json").read_text())["command"])
    script = next(i for i, arg in enumerate(command) if arg.endswith("pretrain_gpt.py"))
    flags = [str(tmp_path) if previous in ("--save", "--tensorboard-dir") else arg
             for previous, arg in zip([None, *command[script + 1:]], command[script + 1:])]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=2\nnode-b slots=2\n")
    port = free_port()
    nodes = [subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "deepspeed"), "--hostfile",
                               str(hostfile), "--no_ssh", f"--node_rank={rank}", "--master_addr=127.0.0.1",
                               f"--master_port={port}", command[script], *flags], cwd=REPO, env=quiet_environment(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for rank in (0, 1)]
    first, last = [finish(node) for node in nodes]
    assert [record.lm_loss for record in parse_log(last).iterations] == reference
    assert not parse_log(first).iterations  # the logging rank 3 runs on node-b
