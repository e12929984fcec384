"""W&B beside TensorBoard (megatron/training/wandb_log.py): the same points under the same tags and x-axes, the
run id kept in the checkpoint directory and continued on resume, wandb missing or failing as one line. Offline
only (WANDB_MODE=offline): no network."""
import logging
import os
import subprocess
import sys

import pytest

from megatron.config.arguments import parse_args, validate_args
from megatron.errors import InputError, RunError
from megatron.training.tensorboard_log import ScalarLog, TensorBoardOptions, TensorBoardWriter
from megatron.training.wandb_log import WandbWriter, recorded_run_id, start_wandb
from tests.helpers.paths import PACKAGE_ROOT
from tests.helpers.training import TINY_FLAGS
from tests.helpers.wandb_files import offline_runs, run_history


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch, tmp_path):
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb-home"),
                        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                        "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(name, value)
    import wandb
    yield
    wandb.teardown()  # wandb keeps its settings (the environment's, read once) per process until torn down


def logging_config(save_dir="", project="demo", required=False):
    args = parse_args(["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "8",
                       "--max-position-embeddings", "8", "--micro-batch-size", "1", "--train-iters", "1",
                       "--lr", "1e-3", "--mock-data", "--vocab-size", "16", "--tokenizer-type", "NullTokenizer",
                       "--save", "/nonexistent", "--wandb-project", project, "--wandb-save-dir", save_dir,
                       *(["--wandb-required"] if required else [])])
    from megatron.config.flags.logging_flags import section
    return section(vars(args))


def tensorboard_points(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir)
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_points(rows):
    """Each tag's (x, value) pairs, x read from the row's value of the tag's axis."""
    points = {}
    for row in rows:
        for tag, value in row.items():
            if tag in ("iteration", "samples", "tokens"):
                continue
            axis = next((axis for suffix, axis in ((" vs samples", "samples"), (" vs tokens", "tokens"),
                                                   ("x=samples", "samples"), ("x=tokens", "tokens"))
                         if tag.endswith(suffix)), "iteration")
            points.setdefault(tag, []).append((row[axis], value))
    return points


def test_wandb_holds_the_tensorboard_points(tmp_path):
    config = logging_config(str(tmp_path))
    wandb = start_wandb(config, None, str(tmp_path / "ckpt"), {"num_layers": 2})
    board = ScalarLog([TensorBoardWriter(str(tmp_path / "tb"), 10), wandb],
                      TensorBoardOptions(batch_size=True, timers=True, validation_ppl=True, memory=True))
    for iteration in (1, 2, 3):
        board.training(iteration, 8 * iteration, 256 * iteration, loss=5.0 / iteration, learning_rate=1e-3 * iteration,
                       batch_size=8, loss_scale=1.0, grad_norm=0.5 + iteration, num_zeros=None, params_norm=2.0,
                       curriculum_seqlen=16)
        board.throughput(iteration, 12.5, 0.25, None)
        board.timers(iteration, 8 * iteration, 256 * iteration, 0.1 * iteration, {"train-step": 3.0})
        board.memory(iteration, 1000 + iteration)
    board.validation(3, 24, 768, 1.5, 4.48)
    board.close()
    expected = tensorboard_points(str(tmp_path / "tb"))
    run_dir, = offline_runs(str(tmp_path))
    run_id, run_config, rows = run_history(run_dir)
    got = wandb_points(rows)
    # W&B alone takes upstream main's throughput scalars (main writes them to W&B only)
    assert set(got) == set(expected) | {"throughput/samples_per_sec", "throughput/tflops"}
    assert "lm-loss-training/lm loss vs tokens" in got and got["throughput/tflops"] == [(1, 0.25), (2, 0.25), (3, 0.25)]
    for tag, points in expected.items():
        assert [x for x, _ in got[tag]] == [x for x, _ in points], tag
        assert [value for _, value in got[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag
    assert run_config["num_layers"] == 2
    assert recorded_run_id(str(tmp_path / "ckpt")) == run_id


def test_a_run_loading_the_checkpoint_continues_its_wandb_run(tmp_path, caplog):
    config = logging_config(str(tmp_path))
    save = str(tmp_path / "ckpt")
    with caplog.at_level(logging.INFO):
        first = start_wandb(config, None, save, {})
        first.close()
        second = start_wandb(config, save, save, {})
        second.close()
    assert first.run.id == second.run.id
    runs = offline_runs(str(tmp_path))
    assert [run_history(run)[0] for run in runs] == [first.run.id] * 2
    assert f"W&B: continues run {first.run.id} offline in {runs[1]}; upload it with `wandb sync {runs[1]}`" in \
        caplog.messages
    fresh = start_wandb(config, None, save, {})  # not loading: a new run, whose id the directory now keeps
    fresh.close()
    assert fresh.run.id != first.run.id and recorded_run_id(save) == fresh.run.id


def test_wandb_missing_is_one_line_and_training_goes_on_unless_required(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with caplog.at_level(logging.WARNING):
        assert start_wandb(logging_config(str(tmp_path)), None, None, {}) is None
    assert caplog.messages == ["the wandb package is not installed (pip install wandb, or `pip install -e .[wandb]` "
                               "in this repository); training goes on without W&B (--wandb-required would stop it)"]
    with pytest.raises(RunError, match=r"not installed .*--wandb-required stops the run"):
        start_wandb(logging_config(str(tmp_path), required=True), None, None, {})


def test_wandb_failing_to_start_is_one_line(tmp_path, monkeypatch, caplog):
    # Online without an API key (none in the environment, HOME's .netrc or the config dir): wandb.init refuses at
    # once, before any connection.
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with caplog.at_level(logging.WARNING):
        assert start_wandb(logging_config(str(tmp_path)), None, None, {}) is None
    assert caplog.messages == ["W&B did not start: UsageError: No API key configured. Use `wandb login` to log in.; "
                               "training goes on without W&B (--wandb-required would stop it)"]
    with pytest.raises(RunError, match="W&B did not start: "):
        start_wandb(logging_config(str(tmp_path), required=True), None, None, {})


def test_wandb_without_a_directory_is_refused():
    args = parse_args([*TINY_FLAGS, "--micro-batch-size", "1", "--train-iters", "1", "--mock-data",
                       "--wandb-project", "demo"])
    with pytest.raises(InputError, match=r"--wandb-project/--wandb-exp-name keep W&B's files in <--save>/wandb"):
        validate_args(args, 1, "cpu")


@pytest.mark.full
def test_training_run_logs_the_tensorboard_loss_series_and_resumes_it(data_prefix, tmp_path):
    """The CPU demo's flags with upstream main's --wandb-* flags: W&B holds TensorBoard's series (every tag, the
    timers' and validation perplexity's too); a run resumed from the checkpoint continues the same W&B run."""
    save = str(tmp_path / "ckpt")
    common = [sys.executable, os.path.join(PACKAGE_ROOT, "pretrain_gpt.py"), *TINY_FLAGS, "--micro-batch-size", "4",
              "--global-batch-size", "8", "--data-path", data_prefix, "--log-interval", "1", "--eval-interval", "3",
              "--eval-iters", "1", "--train-iters", "6", "--save", save, "--save-interval", "3", "--tensorboard-dir",
              str(tmp_path / "tb"), "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard",
              "--timing-log-level", "1", "--wandb-project", "demo", "--wandb-exp-name", "tiny"]
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    for extra in (["--exit-interval", "3"], ["--load", save]):  # stops after iteration 3; resumes there
        result = subprocess.run([*common, *extra], capture_output=True, text=True, env=env, cwd=PACKAGE_ROOT)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = offline_runs(os.path.join(save, "wandb"))
    histories = [run_history(run) for run in runs]
    assert len(runs) == 2 and histories[0][0] == histories[1][0] == recorded_run_id(save)
    assert histories[0][1]["layout"]["world_size"] == 1 and histories[0][1]["wandb_project"] == "demo"
    got = wandb_points([row for _, _, rows in histories for row in rows])
    board = tensorboard_points(str(tmp_path / "tb"))
    assert [step for step, _ in board["lm-loss-training/lm loss"]] == list(range(1, 7))
    assert [step for step, _ in board["lm-loss-validation/lm loss validation ppl"]] == [3, 6]
    assert "train-step-time" in board and "iteration-time/iteration-time vs tokens" in board
    assert set(got) == set(board) | {"throughput/samples_per_sec", "throughput/tflops"}
    for tag, points in board.items():  # every scalar of both runs, at the same x
        assert [x for x, _ in got[tag]] == [x for x, _ in points], tag
        assert [value for _, value in got[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag
