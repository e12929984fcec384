"""Real processes: when a launcher is killed with SIGKILL, what it started ends too, writing nothing more
(megatron/launched_rank.py; docs/failure-cases.md)."""
import base64
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tests.helpers.training import TINY_FLAGS

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRACE_SECONDS = 30


def running(pid: int) -> bool:
    """Whether `pid` is a process that still runs (a zombie nobody reaps has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def children_of(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == parent:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


def wait_until_ended(pids: list[int]) -> list[int]:
    """The pids of `pids` still running after GRACE_SECONDS (at most)."""
    deadline = time.monotonic() + GRACE_SECONDS
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [pid for pid in pids if running(pid)]


def wait_for(path: str, process: subprocess.Popen, log: str) -> None:
    while not os.path.exists(path):
        assert process.poll() is None, open(log).read()[-3000:]
        time.sleep(0.5)


def test_ranks_end_within_seconds_when_torchrun_is_killed_and_save_nothing_more(data_prefix, tmp_path):
    save, log = str(tmp_path / "ck"), str(tmp_path / "job.log")
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
               os.path.join(ROOT, "pretrain_gpt.py"), *TINY_FLAGS, "--micro-batch-size", "2", "--global-batch-size",
               "4", "--train-iters", "100000", "--eval-iters", "0", "--data-path", data_prefix, "--save", save,
               "--save-interval", "3", "--log-interval", "1"]
    with open(log, "w") as output:
        agent = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT,
                                 env={**environment, "OMP_NUM_THREADS": "1"})
    ranks = []
    try:
        wait_for(os.path.join(save, "latest"), agent, log)
        ranks += [pid for pid in children_of(agent.pid) if "pretrain_gpt.py" in open(f"/proc/{pid}/cmdline").read()]
        assert len(ranks) == 2
        saved = sorted(os.listdir(save))
        agent.kill()  # SIGKILL: torchrun cannot pass anything on
        agent.wait()
        assert wait_until_ended(ranks) == []
        assert sorted(os.listdir(save)) == saved
    finally:
        agent.kill()
        for pid in filter(running, ranks):  # what a failed assertion leaves behind
            os.kill(pid, signal.SIGKILL)


PARENT = """
import subprocess, sys, time
from megatron.launched_rank import end_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=end_with_parent)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_torchrun_started_by_the_launch_script_ends_when_the_script_is_killed():
    """tools/launch_training.py starts torchrun with end_with_parent: a SIGKILL of the script ends torchrun."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    child = int(parent.stdout.readline())
    try:
        assert running(child)
        parent.kill()
        parent.wait()
        assert wait_until_ended([child]) == []
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)


TICKING_RANK = """
import os, sys, time
from megatron.errors import run_cli

def main(argv):
    with open(os.path.join(sys.argv[-1], f"rank{os.environ['RANK']}.pid"), "w") as pid:
        pid.write(str(os.getpid()))
    with open(os.path.join(sys.argv[-1], f"rank{os.environ['RANK']}.ticks"), "a") as ticks:
        while True:  # writes until it is ended
            ticks.write("tick\\n")
            ticks.flush()
            time.sleep(0.1)

run_cli(main)
"""


def deepspeed_command(top: str, rank_script: str, argument: str) -> list:
    """`top` started as `deepspeed --num_gpus 2 rank_script argument` starts it: the `deepspeed` command (which
    starts DeepSpeed's per-node launcher) or that launcher itself."""
    from tests.helpers.distributed import free_port

    if top == "deepspeed command":
        return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port",
                str(free_port()), rank_script, argument]
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1]}).encode()).decode()
    return [sys.executable, "-m", "deepspeed.launcher.launch", f"--world_info={world}", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), rank_script, argument]


@pytest.mark.parametrize("killed", ["deepspeed.launcher.launch", "deepspeed command"])
def test_ranks_end_within_seconds_when_the_deepspeed_launcher_is_killed_and_write_nothing_more(tmp_path, killed):
    """The `deepspeed` command starts DeepSpeed's per-node launcher, which starts the ranks (a rank here writes a
    line every 0.1 s through run_cli, as pretrain_gpt.py runs): a SIGKILL of either ends the ranks."""
    rank_script = tmp_path / "rank.py"
    rank_script.write_text(TICKING_RANK)
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    top = subprocess.Popen(deepspeed_command(killed, str(rank_script), str(tmp_path)), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, cwd=ROOT,
                           env={**environment, "PYTHONPATH": os.pathsep.join([ROOT, environment.get("PYTHONPATH", "")])})
    ranks, launchers = [], []
    try:
        for rank in (0, 1):
            wait_for(str(tmp_path / f"rank{rank}.ticks"), top, os.devnull)
        ranks = [int((tmp_path / f"rank{rank}.pid").read_text()) for rank in (0, 1)]
        launchers = [top.pid] if killed == "deepspeed.launcher.launch" else children_of(top.pid)
        assert len(launchers) == 1 and sorted(children_of(launchers[0])) == sorted(ranks)
        top.kill()  # SIGKILL
        assert wait_until_ended(ranks) == []
        written = [(tmp_path / f"rank{rank}.ticks").stat().st_size for rank in (0, 1)]
        time.sleep(0.5)
        assert [(tmp_path / f"rank{rank}.ticks").stat().st_size for rank in (0, 1)] == written
    finally:
        for pid in filter(running, [top.pid, *launchers, *ranks]):  # what a failed assertion leaves behind
            os.kill(pid, signal.SIGKILL)
        top.wait()
