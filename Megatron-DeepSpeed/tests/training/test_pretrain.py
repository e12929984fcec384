"""pretrain_gpt.py end to end in one process on CPU: learning, log formats, checkpoints, exact resume."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tests.helpers.training import TINY_FLAGS

from megatron.training.log_lines import parse_log
from tests.helpers.paths import PACKAGE_ROOT

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

ROOT = PACKAGE_ROOT


def pretrain(data_prefix, *flags, expect_failure=False):
    command = [sys.executable, os.path.join(ROOT, "pretrain_gpt.py"), *TINY_FLAGS, "--micro-batch-size", "4",
               "--global-batch-size", "8", "--data-path", data_prefix, "--log-interval", "1",
               "--eval-interval", "10", "--eval-iters", "2", *flags]
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if expect_failure:
        assert result.returncode != 0
        return result
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def straight_run(data_prefix, tmp_path_factory):
    """20 iterations with a checkpoint at 10 (and the end), 2 micro-batches per step."""
    save = str(tmp_path_factory.mktemp("ckpt"))
    result = pretrain(data_prefix, "--train-iters", "20", "--save", save, "--save-interval", "10",
                      "--micro-batch-size", "4", "--global-batch-size", "8",
                      "--tensorboard-dir", os.path.join(save, "tensorboard"))
    return save, result.stdout


def test_loss_falls_and_logs_are_in_megatron_format(straight_run):
    _, stdout = straight_run
    log = parse_log(stdout.splitlines())
    assert [record.iteration for record in log.iterations] == list(range(1, 21))
    assert log.iterations[-1].lm_loss < log.iterations[0].lm_loss - 1.0, stdout
    assert re.search(r"^ iteration +20/ +20 \| consumed samples: +160 \| elapsed time per iteration \(ms\): "
                     r"[\d.]+ \| learning rate: [\d.]+E[-+]\d+ \| global batch size: +8 \| lm loss: [\d.]+E[-+]\d+ "
                     r"\| loss scale: 1\.0 \| grad norm: [\d.]+ \| number of skipped iterations: +0 \| "
                     r"number of nan iterations: +0 \| samples per second: [\d.]+ \| TFLOPs: [\d.e+-]+ \| MFU: n/a \|$",
                     stdout, re.MULTILINE)
    assert [record.iteration for record in log.validations] == [10, 20]
    for record in log.validations:
        assert record.ppl == pytest.approx(np.exp(record.loss), rel=1e-5)
    # Megatron's memory line after the first logged iteration, and ours again after the last one.
    memory = re.findall(r"^\[Rank 0\] \(after (\d+) iterations\) memory \(MB\) \| allocated: [\d.]+ \| "
                        r"max allocated: [\d.]+ \| reserved: [\d.]+ \| max reserved: [\d.]+$", stdout, re.MULTILINE)
    assert memory == ["1", "20"] and log.peak_allocated_mb > 1


def test_tensorboard_scalars(straight_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save, _ = straight_run
    events = EventAccumulator(os.path.join(save, "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("lm-loss-training/lm loss")] == list(range(1, 21))
    assert [event.step for event in events.Scalars("lm-loss-validation/lm loss validation")] == [10, 20]


def test_checkpoint_layout(straight_run):
    save, _ = straight_run
    assert open(os.path.join(save, "latest")).read() == "global_step20"
    assert open(os.path.join(save, "latest_checkpointed_iteration.txt")).read() == "20"
    assert os.path.isdir(os.path.join(save, "global_step10")) and os.path.isdir(os.path.join(save, "global_step20"))
    assert not [name for name in os.listdir(save) if ".tmp" in name]


def test_resume_is_exact(straight_run, data_prefix, tmp_path):
    save, stdout = straight_run
    # Resume from iteration 10: point a fresh directory's `latest` at the saved global_step10.
    resume = tmp_path / "resume"
    resume.mkdir()
    shutil.copytree(os.path.join(save, "global_step10"), resume / "global_step10")  # a link out is refused
    (resume / "latest").write_text("global_step10")
    resumed = pretrain(data_prefix, "--train-iters", "20", "--load", str(resume))
    straight = {r.iteration: r for r in parse_log(stdout.splitlines()).iterations}
    continued = parse_log(resumed.stdout.splitlines()).iterations
    assert f"  successfully loaded checkpoint from {resume} at iteration 10 ({resume}/global_step10)" in \
        resumed.stdout.splitlines()
    assert [r.iteration for r in continued] == list(range(11, 21))
    for record in continued:
        assert record.lm_loss == straight[record.iteration].lm_loss
        assert record.consumed_samples == straight[record.iteration].consumed_samples
        assert record.learning_rate == straight[record.iteration].learning_rate


def test_gradient_accumulation_matches_one_big_micro_batch(straight_run, data_prefix):
    # Same global batch of 8 as one micro-batch: same samples, same mean loss, same update (fp32).
    _, stdout = straight_run
    single = pretrain(data_prefix, "--train-iters", "5", "--lr-decay-iters", "20", "--micro-batch-size", "8",
                      "--global-batch-size", "8", "--eval-iters", "0")
    accumulated = [r.lm_loss for r in parse_log(stdout.splitlines()).iterations[:5]]
    assert [r.lm_loss for r in parse_log(single.stdout.splitlines()).iterations] == pytest.approx(accumulated,
                                                                                                   rel=1e-5)


def test_bad_flags_stop_at_start_with_a_clear_message(data_prefix):
    result = pretrain(data_prefix, "--train-iters", "5", "--fp16", expect_failure=True)
    assert result.returncode == 2
    assert "--fp16 is not supported on device 'cpu'" in result.stderr and "Traceback" not in result.stderr


def test_training_length_in_samples_follows_the_same_schedule(straight_run, data_prefix):
    # 160 samples = 20 iterations of 8; warmup 16 samples = 2 iterations: the straight run's schedule.
    _, stdout = straight_run
    in_samples = pretrain(data_prefix, "--train-samples", "160", "--lr-warmup-iters", "0", "--lr-warmup-samples",
                          "16", "--exit-interval", "5", "--eval-iters", "0")
    records = parse_log(in_samples.stdout.splitlines()).iterations
    straight = parse_log(stdout.splitlines()).iterations[:5]
    assert [(r.iteration, r.train_iters, r.learning_rate, r.lm_loss) for r in records] == \
           [(r.iteration, r.train_iters, r.learning_rate, r.lm_loss) for r in straight]
