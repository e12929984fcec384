"""Multi-node launch on one machine: two node launchers of test/train_full_8p.sh (2 processes each, TP2 x PP2
across the nodes) against the same job on one node of 4 processes, and the deepspeed launcher's hostfile mode
without ssh."""
import os
import socket
import subprocess
import sys

import pytest

from megatron.training.log_lines import parse_log
from tests.distributed_helpers import free_port

pytestmark = pytest.mark.full  # whole runs of the entry script: the full tier

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_ITERS = "3"
QUIET = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def launcher(*args):
    return subprocess.Popen(["bash", os.path.join(REPO, "test", "train_full_8p.sh"), "--device=cpu",
                             f"--train_iters={TRAIN_ITERS}", *args], cwd=REPO, env=QUIET, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(process):
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-4000:]
    return output


def losses(log_path):
    with open(log_path, encoding="utf-8") as log:
        return [record.lm_loss for record in parse_log(log).iterations]


def test_two_node_launchers_train_as_one_node(tmp_path):
    port = free_port()
    nodes = [launcher("--nproc=2", "--nnodes=2", f"--node_rank={rank}", "--master_addr=127.0.0.1",
                      f"--master_port={port}", f"--output_dir={tmp_path / 'two_nodes'}") for rank in (0, 1)]
    first, last = [finish(node) for node in nodes]
    # Node 1 holds the logging rank 3: it prints the summary; node 0 says where it is and exits 0.
    assert last.strip().splitlines()[-3].startswith("Final Performance samples/sec : ")
    assert "Final Performance" not in first
    assert f"The summary is on node 1 (node_rank=1), which holds the logging rank 3" in first
    assert {"train.log", "train.node0.log", "run.json"} <= set(os.listdir(tmp_path / "two_nodes"))

    # One node, no --master_port, while 29500 is taken: torchrun picks a free port.
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", 29500))
            taken.listen()
        except OSError:
            pass  # another job holds it already: just as good
        single = finish(launcher("--nproc=4", f"--output_dir={tmp_path / 'one_node'}"))
    assert single.strip().splitlines()[-3].startswith("Final Performance samples/sec : ")

    two_node_losses = losses(tmp_path / "two_nodes" / "train.log")
    assert len(two_node_losses) == int(TRAIN_ITERS)
    assert two_node_losses == losses(tmp_path / "one_node" / "train.log")
    # Both nodes' ranks wrote the checkpoint into the shared run directory.
    assert (tmp_path / "two_nodes" / "checkpoints" / "latest").read_text().strip() == f"global_step{TRAIN_ITERS}"
