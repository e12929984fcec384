"""The user-facing shell entry points: clear errors for bad input, and a real end-to-end CPU run."""
import os
import subprocess

import pytest
from tests.helpers.entry_scripts import run_script
from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

REPO = REPO_ROOT


@pytest.mark.parametrize("args, message", [
    (["--model_size=huge"], "unknown model size preset 'huge'; valid names: 345M, 1.3B, 2.7B, 3.7B, "
                            "345M_without_mp, 125M_MoE64, 1.3B_MoE128, tiny"),
    (["--data_path=/nonexistent/corpus_text_document"], "bash test/dataset_preprocess_gpt.sh"),
    (["--nproc=3"], "needs a multiple of TP 2 x PP 2 = 4 processes, but 3 are launched"),
    (["--nproc=2", "--ds_sequence_parallel_size=2", "--tensor-model-parallel-size", "1"],
     "needs a multiple of TP 1 x PP 2 x SP 2 = 4 processes, but 2 are launched"),
    (["--nproc=2", "--ds_sequence_parallel_size=2", "--tensor-model-parallel-size", "1",
      "--pipeline-model-parallel-size", "1"], "--ds-sequence-parallel-size 2 runs on DeepSpeed's plain engine"),
    (["--train_iters=abc"], "--train_iters='abc' is not a whole number"),
    (["--modelsize=tiny"], "unrecognized arguments: --modelsize=tiny"),
    (["--device=cuda"], "--device=cuda: DeepSpeed selected 'cuda' but sees no cuda device here"),
    (["--fp16"], "--fp16 is not supported on device 'cpu'"),  # a pretrain_gpt.py flag: checked once, up front
])
def test_bad_input_stops_with_a_clear_message(args, message, tmp_path):
    no_gpus = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the same answers on a machine with GPUs
    result = run_script("train_full_8p.sh", *args, f"--output_dir={tmp_path}", env=no_gpus)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def assert_summary_and_run_directory(output: str, run_dir, checkpoints: bool):
    summary = output.strip().splitlines()[-3:]
    assert summary[0].startswith("Final Performance samples/sec : ") and float(summary[0].split(":")[1]) > 0
    assert summary[1].startswith("Final Train lm loss PPL(accuracy): ") and float(summary[1].split(":")[1]) > 1
    assert summary[2].startswith("E2E Training Duration sec : ")
    assert {"train.log", "run.json", "loss_curve.png", "tensorboard"} <= set(os.listdir(run_dir))
    assert ("checkpoints" in os.listdir(run_dir)) == checkpoints
    assert "pipeline: transformer layers per stage [2, 2]" in output


def test_cpu_performance_run_end_to_end_with_the_tiny_preset(tmp_path):
    """No data or process arguments: the demo data is built if absent, 8 CPU processes train TP2 x PP2 x DP2."""
    result = run_script("train_performance_8p.sh", "--train_iters=6", f"--output_dir={tmp_path}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_summary_and_run_directory(result.stdout, tmp_path, checkpoints=False)  # --output_dir is the run directory


def test_cpu_full_run_end_to_end_with_the_tiny_preset(shared_full_run):
    """The suite's one run of train_full_8p.sh (conftest.py: 4 CPU processes, TP2 x PP2), which also saves."""
    run_dir, output = shared_full_run
    assert_summary_and_run_directory(output, run_dir, checkpoints=True)


def test_a_full_run_started_again_in_its_run_directory_resumes(tmp_path, capsys):
    from tools.launch_training import resume_flags
    checkpoints = tmp_path / "checkpoints"
    assert resume_flags(str(checkpoints)) == []  # first launch: nothing to resume
    (checkpoints / "global_step6").mkdir(parents=True)
    (checkpoints / "latest").write_text("global_step6")
    assert resume_flags(str(checkpoints)) == ["--load", str(checkpoints)]
    assert f"Resuming from {checkpoints / 'global_step6'}" in capsys.readouterr().out


ONE_STAGE = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1"]  # fewer processes to start


def test_a_failed_and_an_interrupted_run_say_how_they_ended_in_run_json(tmp_path):
    import json
    import signal
    import time
    failed = run_script("train_full_8p.sh", "--nproc=1", "--train_iters=2", f"--output_dir={tmp_path / 'failed'}",
                        *ONE_STAGE, "--load", str(tmp_path / "nothing"))
    assert failed.returncode == 1
    ended = json.loads((tmp_path / "failed" / "run.json").read_text())["ended"]
    assert ended.startswith("failed: --load ") and "holds no checkpoint" in ended

    run_dir = tmp_path / "interrupted"
    launcher = subprocess.Popen(["bash", os.path.join(REPO, "test", "train_full_8p.sh"), "--nproc=2",
                                 "--train_iters=100000", f"--output_dir={run_dir}", *ONE_STAGE, "--log-interval", "1"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while " iteration " not in ((run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(1)
    os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C reaches every process of the terminal
    assert launcher.wait(timeout=120) == 130
    info = json.loads((run_dir / "run.json").read_text())
    assert info["ended"] == "interrupted (Ctrl-C)" and info["end_time"] >= info["start_time"]
