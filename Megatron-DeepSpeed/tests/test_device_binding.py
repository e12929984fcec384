"""Every rank binds its own accelerator before its first collective and before it touches the device.

nccl and hccl build a rank's communicator on the current device, and torch.distributed puts object collectives
there; until something binds LOCAL_RANK that is device 0 in every rank of a node, so eight ranks would meet on one
GPU. Two real processes train one step on a stand-in accelerator with numbered devices
(helpers/device_binding_worker.py) that records, per rank, the device bound and the device current at every seeding and
every collective.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.distributed import free_port

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "device_binding_worker.py")
FLAGS = ["--model-size", "tiny", "--pipeline-model-parallel-size", "1", "--tensor-model-parallel-size", "2",
         "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "200", "--micro-batch-size", "1",
         "--global-batch-size", "1", "--train-iters", "1", "--eval-iters", "0", "--seq-length", "32"]


def run_two_ranks(tmp_path) -> list:
    port, ranks = str(free_port()), []
    for rank in range(2):
        environment = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "lo",
                       "OMP_NUM_THREADS": "1"}
        ranks.append(subprocess.Popen([sys.executable, WORKER, str(tmp_path / f"events{rank}.json"), *FLAGS],
                                      env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [process.communicate(timeout=300)[0] for process in ranks]
    for rank, process in enumerate(ranks):
        assert process.returncode == 0, f"rank {rank} failed:\n{outputs[rank][-3000:]}"
    return [json.loads((tmp_path / f"events{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.full
def test_each_rank_binds_its_device_before_its_first_collective_and_uses_no_other(tmp_path):
    for rank, events in enumerate(run_two_ranks(tmp_path)):
        assert events[0] == ["set_device", rank], f"rank {rank} did not bind its device first: {events[:3]}"
        collectives = [event for event in events if event[0] == "collective"]
        assert len(collectives) > 10  # the start-up checks, the model-parallel groups, DeepSpeed and the step
        elsewhere = [event for event in events if event[-1] != rank]
        assert elsewhere == [], f"rank {rank} used another device: {elsewhere[:5]}"
