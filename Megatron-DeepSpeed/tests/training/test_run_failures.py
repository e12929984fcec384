"""Real training processes that fail or are stopped: each says so in one line, with the right exit status,
and nothing a user has is lost (docs/troubleshooting.md)."""
import os
import re
import resource
import shutil
import signal
import subprocess
import sys

import pytest
from tests.helpers.distributed import free_port, run_on_ranks
from tests.helpers.training import TINY_FLAGS
from tests.helpers.paths import PACKAGE_ROOT

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

ROOT = PACKAGE_ROOT
FLAGS = [*TINY_FLAGS, "--micro-batch-size", "4", "--global-batch-size", "8", "--log-interval", "1", "--eval-iters", "0"]


def pretrain_command(data_prefix, *flags):
    return [sys.executable, os.path.join(ROOT, "pretrain_gpt.py"), *FLAGS, "--data-path", data_prefix, *flags]


def single_process_environment():
    return {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


def run_pretrain(data_prefix, *flags, limit_file_size=None):
    """pretrain_gpt.py as one process; `limit_file_size` (bytes) sets its ulimit -f, which fails a write
    beyond it as a full disk would (EFBIG instead of ENOSPC, and no root privileges needed)."""
    limit = None if limit_file_size is None else (
        lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size)))
    return subprocess.run(pretrain_command(data_prefix, *flags), capture_output=True, text=True, cwd=ROOT,
                          env=single_process_environment(), preexec_fn=limit, timeout=600)


def assert_one_line_error(result, status, *fragments):
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == status, result.stdout[-2000:] + result.stderr[-2000:]
    assert last.startswith("error: ") and "Traceback" not in result.stderr, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in last, last


def latest(directory):
    with open(os.path.join(directory, "latest")) as handle:
        return handle.read()


def test_a_mistyped_load_stops_at_start_up_and_leaves_the_checkpoints_alone(data_prefix, tmp_path):
    save = tmp_path / "ck"
    save.mkdir()
    (save / "latest").write_text("global_step10")
    (save / "global_step10").mkdir()
    result = run_pretrain(data_prefix, "--train-iters", "4", "--load", str(tmp_path / "ckk"), "--save", str(save),
                          "--save-interval", "2")
    assert_one_line_error(result, 2, f"--load {tmp_path}/ckk holds no checkpoint (it does not exist")
    assert sorted(os.listdir(save)) == ["global_step10", "latest"] and latest(save) == "global_step10"


def test_a_missing_data_prefix_is_one_line(tmp_path):
    result = run_pretrain(str(tmp_path / "absent_text_document"), "--train-iters", "2")
    assert_one_line_error(result, 2, f"{tmp_path}/absent_text_document.idx not found")


@pytest.fixture(scope="module")
def stopped_by_sigterm(data_prefix, tmp_path_factory):
    """A run with --exit-signal-handler (and data-loader workers) whose processes all receive SIGTERM during its
    second iteration, as torchrun and batch schedulers send it."""
    save = str(tmp_path_factory.mktemp("sigterm") / "ck")
    process = subprocess.Popen(pretrain_command(data_prefix, "--train-iters", "1000", "--save", save, "--save-interval",
                                                "1000", "--exit-signal-handler", "--num-workers", "2"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                               env=single_process_environment(), start_new_session=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(" iteration        1/"):
            os.killpg(process.pid, signal.SIGTERM)
    return save, process.wait(timeout=600), "".join(lines)


def test_sigterm_with_the_exit_signal_handler_saves_and_exits_0(stopped_by_sigterm):
    save, returncode, output = stopped_by_sigterm
    assert returncode == 0, output[-3000:]
    stopped_at = int(latest(save).removeprefix("global_step"))
    assert stopped_at >= 1 and f" iteration {stopped_at + 1:8d}/" not in output
    assert (f"exiting program at iteration {stopped_at}: SIGTERM received (--exit-signal-handler); checkpoint saved "
            f"to {save}") in output


def test_a_save_that_hits_a_full_disk_says_why_and_keeps_the_last_checkpoint(stopped_by_sigterm, data_prefix,
                                                                             tmp_path):
    # Resume the stopped run in a copy, with a file-size limit that only its optimizer-state file exceeds.
    save = str(tmp_path / "ck")
    shutil.copytree(stopped_by_sigterm[0], save, symlinks=True)
    kept = latest(save)
    step = int(kept.removeprefix("global_step")) + 1
    largest = max(entry.stat().st_size for entry in os.scandir(os.path.join(save, kept)))
    result = run_pretrain(data_prefix, "--train-iters", str(step + 2), "--lr-decay-iters", "1000", "--load", save,
                          "--save", save, "--save-interval", "1", limit_file_size=largest // 2)
    assert_one_line_error(result, 1, f"saving checkpoint global_step{step} to {save} failed: a file exceeds the "
                                     f"file-size limit (EFBIG): ulimit -f allows {largest // 2} bytes per file",
                          f"its partial files were removed and {save}/latest still names the complete {kept}")
    assert latest(save) == kept and f"global_step{step}" not in os.listdir(save)
    assert "zero_to_fp32.py" not in os.listdir(save)  # DeepSpeed's copy, which cannot read our checkpoints


def exit_requests_seen(duration_minutes):
    """ExitRequests' verdicts: before any request; after SIGTERM to rank 0 only; once rank 1 alone has run
    for longer than `duration_minutes`."""
    import time

    import torch.distributed as dist

    from megatron.training.exit_requests import ExitRequests

    rank = dist.get_rank()
    requests = ExitRequests(on_sigterm=True, duration_minutes=None, started=time.monotonic())
    quiet = requests.reason()
    if rank == 0:
        os.kill(os.getpid(), signal.SIGTERM)
    signalled = requests.reason()
    requests.close()
    started = time.monotonic() - (60 * duration_minutes + 1 if rank == 1 else 0)
    overdue = ExitRequests(on_sigterm=False, duration_minutes=duration_minutes, started=started).reason()
    return quiet, signalled, overdue


def test_exit_requests_are_agreed_on_by_every_rank():
    verdicts = run_on_ranks(exit_requests_seen, 2, 5.0)
    assert verdicts == [(None, "SIGTERM received (--exit-signal-handler)", "--exit-duration-in-mins 5 reached")] * 2


TIMEOUT_SECONDS = 3.0


def train_beside_a_frozen_peer(argv, port):
    """Rank 1's model stops answering in iteration 2 for longer than the collectives' timeout (but not so long
    that its own watchdog ends it); returns each rank's one-line error and the heartbeat lines it logged."""
    import logging
    import time

    import torch.distributed as dist

    from megatron.errors import RunError
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    dist.destroy_process_group()  # pretrain makes its own, with the --distributed-timeout-minutes under test
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    heartbeats = []
    handler = logging.Handler()
    handler.emit = lambda record: heartbeats.append(record.getMessage())
    logging.getLogger("megatron.training.watchdog").addHandler(handler)
    logging.getLogger("megatron.training.watchdog").setLevel(logging.INFO)
    forwards = [0]

    def provider(*args):
        model = model_provider(*args)

        def freeze(module, inputs):
            forwards[0] += 1
            if dist.get_rank() == 1 and forwards[0] == 2:
                time.sleep(TIMEOUT_SECONDS + 1.25)

        model.register_forward_pre_hook(freeze)
        return model

    try:
        pretrain(provider, argv)
    except RunError as err:
        return str(err), heartbeats
    return None, heartbeats


def test_a_frozen_rank_ends_the_job_with_a_message_naming_where_its_peer_waited(data_prefix):
    argv = [*FLAGS, "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3", "--data-path",
            data_prefix, "--no-pipeline-parallel", "--distributed-timeout-minutes", str(TIMEOUT_SECONDS / 60)]
    (waiting, heartbeats), (frozen, _) = run_on_ranks(train_beside_a_frozen_peer, 2, argv, free_port())
    assert re.match(r"rank 0: iteration 2 stopped after waiting \d+ s for the other ranks \(.*\); another rank died "
                    r"or froze \(see its messages above\), --distributed-timeout-minutes is 0.05$", waiting), waiting
    assert heartbeats and all(line.startswith("rank 0: still in iteration 2 after ") for line in heartbeats)
    assert frozen.startswith("rank 1: iteration 2 stopped after waiting ")  # its peer was gone when it woke


def test_a_phase_past_its_deadline_ends_the_process_with_one_line():
    hang = ("import time; from megatron.training.watchdog import Watchdog\n"
            "with Watchdog(rank=3, timeout_minutes=0.01).phase('iteration 7', deadline=True): time.sleep(60)")
    result = subprocess.run([sys.executable, "-c", hang], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 1
    assert re.fullmatch(r"error: rank 3: iteration 7 has waited \d s, longer than --distributed-timeout-minutes "
                        r"0.01: another rank died or froze \(see its messages above\); stopping this rank\n",
                        result.stderr), result.stderr


def test_a_diverged_job_reports_one_line_and_keeps_the_checkpoint_before_it(tmp_path):
    """The issue's run: lr 1e6 on 4 processes through the entry script (demo data, built if absent)."""
    repo = os.path.dirname(ROOT)
    result = subprocess.run(["bash", os.path.join(repo, "test", "train_full_8p.sh"), "--nproc=4", "--train_iters=12",
                             f"--output_dir={tmp_path}", f"--master_port={free_port()}", "--lr", "1e6", "--min-lr",
                             "1e5", "--save-interval", "2", "--max-consecutive-nan-iterations", "3"],
                            capture_output=True, text=True, cwd=repo, timeout=900)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    error = re.fullmatch(r"error: training diverged at iteration (\d+): iterations \d+ to \d+ \(3 in a row, "
                         r"--max-consecutive-nan-iterations\) .* (\S+)/latest still names (global_step\d+), saved "
                         r"before it; .*\(log: \S+/train.log\)", result.stderr.strip().splitlines()[-1])
    assert error, result.stderr[-3000:]
    diverged_at, checkpoints, kept = int(error.group(1)), error.group(2), error.group(3)
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [error.group(0)]
    for noise in ("Traceback", "ChildFailedError"):
        assert noise not in result.stdout + result.stderr
    summary = result.stdout.strip().splitlines()[-4:]
    assert summary[0] == f"Training diverged at iteration {diverged_at}: its loss is not finite, so it has no PPL"
    assert summary[2] == "Final Train lm loss PPL(accuracy): nan"
    assert latest(checkpoints) == kept and int(kept.removeprefix("global_step")) <= diverged_at - 3
