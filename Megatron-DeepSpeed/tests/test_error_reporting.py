"""run_cli's one-line errors, said once per launch: ranks started by one launcher that fail alike print the
line once; a different message, or a process on its own, always prints."""
import os
import subprocess
import sys

MEGATRON_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAIL = """
import sys
from megatron.errors import InputError, run_cli
def main(argv):
    raise InputError(sys.argv[1])
run_cli(main)
"""


def launch(messages, tmp_path, local_world_size):
    """Processes started together by this (test) process, as a launcher starts ranks: their stderr and statuses."""
    env = dict(os.environ, PYTHONPATH=MEGATRON_ROOT, TMPDIR=str(tmp_path), LOCAL_WORLD_SIZE=str(local_world_size))
    processes = [subprocess.Popen([sys.executable, "-c", FAIL, message], env=env, stderr=subprocess.PIPE, text=True)
                 for message in messages]
    outputs = [process.communicate()[1] for process in processes]
    return "".join(outputs), [process.returncode for process in processes]


def test_ranks_failing_alike_say_it_once_and_all_exit_non_zero(tmp_path):
    stderr, statuses = launch(["--lr -1: must be positive"] * 3, tmp_path, 3)
    assert stderr.splitlines() == ["error: --lr -1: must be positive"]
    assert statuses == [2, 2, 2]


def test_a_different_message_is_said_too(tmp_path):
    stderr, _ = launch(["rank 0 failed", "rank 0 failed", "rank 1 failed"], tmp_path, 3)
    assert sorted(stderr.splitlines()) == ["error: rank 0 failed", "error: rank 1 failed"]


def test_a_process_on_its_own_always_says_it(tmp_path):
    for _ in range(2):  # the same parent and message twice: each run is its own launch
        stderr, statuses = launch(["bad flag"], tmp_path, 1)
        assert stderr.splitlines() == ["error: bad flag"] and statuses == [2]
