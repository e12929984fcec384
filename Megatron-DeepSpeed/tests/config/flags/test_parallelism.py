"""The ZeRO stage a run gets when its user chose none (megatron/config/flags/parallelism.default_zero_stage), on
real training runs: one data-parallel rank trains at ZeRO 0 and says so in one line, and resumes; a checkpoint
saved at ZeRO 1 over one data-parallel rank resumes at its own stage, exactly. The choice itself for every
layout: tests/config/test_arguments.py; its memory: tools/benchmark_zero_memory.py."""
import os

import pytest
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, logged_lines

from megatron.checkpoint.formats.detect import read_client_state
from megatron.checkpoint.file_names import ARGS

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

THREE_ITERATIONS = [*COMMON, "--train-iters", "3", "--lr-decay-iters", "3"]  # the last --train-iters wins


def train_and_log(argv):
    """pretrain() on this rank: the lines it logged and the losses of its iterations."""
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    results = []
    lines = logged_lines(lambda: results.append(pretrain(model_provider, argv)))
    return lines, results[0].losses


def zero_stage_lines(lines) -> list:
    return [line for line in lines if line.startswith("ZeRO stage")]


def recorded_zero_stage(step_dir) -> int:
    return read_client_state(str(step_dir), verify=False)[ARGS]["zero_stage"]


def test_tensor_parallel_over_one_data_parallel_rank_trains_at_zero_0_and_says_so(data_prefix, tmp_path):
    """The issue's 680M GPT at TP 2 (DP 1), shrunk: no --zero-stage gives ZeRO 0 (DeepSpeed's ZeRO 1 would keep
    flat fp32 copies and partition nothing), the run says so once, and its checkpoint records that stage (an exact
    resume at ZeRO 0 over one data-parallel rank: test_training.py::test_resume_is_exact)."""
    flags = [*THREE_ITERATIONS, "--tensor-model-parallel-size", "2", "--data-path", data_prefix, "--save",
             str(tmp_path), "--save-interval", "2", "--train-iters", "2"]
    (lines, losses), _ = run_on_ranks(train_and_log, 2, flags)
    assert zero_stage_lines(lines) == [
        "ZeRO stage 0: one data-parallel rank, over which ZeRO 1 would partition nothing and only add DeepSpeed's "
        "fp32 copies of the weights and gradients (--zero-stage 1 to use it anyway)"]
    assert len(losses) == 2 and recorded_zero_stage(tmp_path / "global_step2") == 0
    assert not [name for name in os.listdir(tmp_path / "global_step2") if name.startswith("zero_pp_rank")]


def test_a_zero_1_checkpoint_of_one_data_parallel_rank_resumes_at_zero_1_exactly(data_prefix, tmp_path):
    """Saved before ZeRO 0 became the default there: without --zero-stage the resumed run takes the
    checkpoint's stage (its optimizer state is in ZeRO 1's files) and repeats the uninterrupted run's step."""
    data = ["--data-path", data_prefix]
    _, straight = run_on_ranks(train_and_log, 1, [*THREE_ITERATIONS, *data, "--zero-stage", "1", "--save",
                                                  str(tmp_path), "--save-interval", "2"])[0]
    (tmp_path / "latest").write_text("global_step2")
    lines, resumed = run_on_ranks(train_and_log, 1, [*THREE_ITERATIONS, *data, "--load", str(tmp_path)])[0]
    assert zero_stage_lines(lines) == [
        f"ZeRO stage 1: the stage at which the optimizer state of --load {tmp_path} loads (--zero-stage chooses; "
        f"--no-load-optim loads the weights at any stage)"]
    assert resumed == straight[2:]
