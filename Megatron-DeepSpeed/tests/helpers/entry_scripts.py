"""The entry scripts (test/*.sh) as the tests start them, and the one CPU run of test/train_full_8p.sh that the
entry-script and multi-node tests share: most of such a run is its processes starting, so it runs once a session."""
import os
import socket
import subprocess

from tests.helpers.paths import REPO_ROOT

SHARED_RUN_ITERS = 3


def quiet_environment() -> dict:
    """One thread per process and no GPU, so that the CPU processes of a run share this machine's cores."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_script(name: str, *args: str, timeout: int = 900, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", os.path.join(REPO_ROOT, "test", name), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT, env=env)


def start_full_run(*args: str) -> subprocess.Popen:
    """test/train_full_8p.sh on CPU processes for SHARED_RUN_ITERS iterations, its output and errors in one pipe."""
    return subprocess.Popen(["bash", os.path.join(REPO_ROOT, "test", "train_full_8p.sh"), "--device=cpu",
                             f"--train_iters={SHARED_RUN_ITERS}", *args], cwd=REPO_ROOT, env=quiet_environment(),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-4000:]
    return output


def one_node_full_run(run_dir: str) -> str:
    """The shared run: one node of 4 processes (the tiny preset's TP 2 x PP 2), started without --master_port while
    29500, torchrun's default, is taken (torchrun then picks a free port); its output."""
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", 29500))
            taken.listen()
        except OSError:
            pass  # another job holds it already: just as good
        return finish(start_full_run("--nproc=4", f"--output_dir={run_dir}"))
