"""Parallelism flags (megatron/config/flags/parallelism.py): the data-parallel size the world leaves, the DeepSpeed
JSON and the ZeRO stage, the engine and sequence parallelism checked against the layout, the backend, their
refusals, and the ParallelConfig. Then the ZeRO stage a run gets when its user chose none (default_zero_stage), on
real training runs: one data-parallel rank trains at ZeRO 0 and says so in one line, and resumes; a checkpoint
saved at ZeRO 1 over one data-parallel rank resumes at its own stage, exactly. The choice itself for every
layout: tests/config/test_arguments.py; its memory: tools/benchmark_zero_memory.py."""
import os

import pytest
from tests.helpers.distributed import run_on_ranks
from tests.helpers.flag_groups import refusal, resolved
from tests.helpers.training import COMMON, logged_lines

from megatron.checkpoint.formats.detect import read_client_state
from megatron.checkpoint.file_names import ARGS
from megatron.config.flags import parallelism
from megatron.config.job import ParallelConfig

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


def test_the_world_leaves_the_data_parallel_size():
    assert parallelism.sizes({**resolved(), "tensor_model_parallel_size": 2}, 8) == {"world_size": 8,
                                                                                    "data_parallel_size": 4}


@pytest.mark.parametrize("world_size, message", [
    (0, "world size 0 must be at least 1; check the launcher (WORLD_SIZE)"),
    (2, "--tensor-model-parallel-size 2 x --pipeline-model-parallel-size 2 needs at least 4 processes (one per "
        "device), but world size is 2"),
    (6, "world size 6 is not divisible by --tensor-model-parallel-size 2 x --pipeline-model-parallel-size 2 = 4; "
        "launch a multiple of 4 processes or lower those sizes"),
])
def test_world_size_refusals(world_size, message):
    values = {**resolved(), "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}
    assert refusal(parallelism.sizes, values, world_size).startswith(message)


def test_the_zero_stage_from_the_flag_the_json_or_the_default(tmp_path):
    assert resolved()["zero_stage"] == 0 and not resolved()["zero_stage_chosen"]
    assert resolved(world_size=2)["zero_stage"] == 1
    assert parallelism.default_zero_stage({**resolved(), "cpu_optimizer": True})[0] == 1
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 2}}')
    from_json = resolved("--deepspeed_config", str(config), "--no-pipeline-parallel")
    assert (from_json["zero_stage"], from_json["zero_stage_chosen"]) == (2, True)
    config.write_text('{"zero_optimization": {"stage": 5}}')
    assert refusal(parallelism.deepspeed_json, {**resolved(), "deepspeed_config": str(config), "zero_stage": None}) == (
        f"--deepspeed_config {config} sets zero_optimization.stage=5; use 0, 1, 2 or 3")
    assert refusal(parallelism.deepspeed_json, {**resolved(), "deepspeed_config": "absent.json"}).startswith(
        "--deepspeed_config absent.json does not exist")


@pytest.mark.parametrize("changed, message", [
    ({"zero_reduce_bucket_size": -1}, "--zero-reduce-bucket-size -1 must be 0 (DeepSpeed's default) or a positive"),
    ({"remote_device": "cpu"}, "--remote-device cpu places ZeRO-3's partitioned parameters, but --zero-stage is 0"),
    ({"use_pin_memory": True}, "--use-pin-memory pins the CPU memory of --remote-device cpu"),
])
def test_zero_refusals(changed, message):
    assert refusal(parallelism.validate_zero, {**resolved(), **changed}).startswith(message)


@pytest.mark.parametrize("changed, message", [
    ({"tensor_model_parallel_size": 2, "sequence_parallel": True, "seq_length": 15},
     "--sequence-parallel splits --seq-length 15 over --tensor-model-parallel-size 2, which does not divide it"),
    ({"pipeline_model_parallel_size": 3}, "--pipeline-model-parallel-size 3 is more than --num-layers 2"),
    ({"pipeline_model_parallel_size": 2, "no_pipeline_parallel": True},
     "--no-pipeline-parallel contradicts --pipeline-model-parallel-size 2; drop one of them"),
    ({"zero_stage": 2}, "--zero-stage 2 with --pipeline-model-parallel-size 1: DeepSpeed's pipeline engine supports "
                        "only ZeRO stages 0 and 1; use --zero-stage 0 or 1, or add --no-pipeline-parallel"),
    ({"tensor_model_parallel_size": 2, "sequence_parallel": True, "zero_stage": 2, "no_pipeline_parallel": True},
     "--sequence-parallel with --zero-stage 2: ZeRO stages 2 and 3 partition each gradient during backward"),
    ({"tensor_model_parallel_size": 2, "sequence_parallel": True, "bf16": True},
     "--sequence-parallel with --bf16 and --zero-stage 0 on the pipeline engine"),
    ({"ds_sequence_parallel_size": 2, "tensor_model_parallel_size": 2},
     "--ds-sequence-parallel-size 2 with --tensor-model-parallel-size 2 and --pipeline-model-parallel-size 1"),
    ({"ds_sequence_parallel_size": 2}, "--ds-sequence-parallel-size 2 runs on DeepSpeed's plain engine"),
    ({"ds_sequence_parallel_size": 4, "no_pipeline_parallel": True},
     "--num-attention-heads 2 is not divisible by --ds-sequence-parallel-size 4"),
])
def test_layout_refusals(changed, message):
    assert refusal(parallelism.features, {**resolved(), **changed}).startswith(message)


@pytest.mark.parametrize("changed, message", [
    ({"ds_sequence_parallel_size": 3}, "--num-attention-heads 2 is not divisible by --ds-sequence-parallel-size 3; "
     "each sequence-parallel rank attends with whole heads; choose a size that divides the head count"),
    ({"ds_sequence_parallel_size": 2, "num_attention_heads": 4, "num_key_value_heads": 1},
     "--num-key-value-heads 1 is not divisible by --ds-sequence-parallel-size 2; each sequence-parallel rank needs "
     "whole key/value heads; choose a size that divides them"),
    ({"ds_sequence_parallel_size": 2, "seq_length": 15}, "--seq-length 15 is not divisible by "
     "--ds-sequence-parallel-size 2; each rank holds an equal chunk of every sequence; choose a length that is a "
     "multiple of the size"),
])
def test_a_ulysses_size_that_divides_nothing_names_its_value_once(changed, message):
    """Reported as "--ds-sequence-parallel-size 3 3": the size was given with its value, and the rule added it."""
    assert refusal(parallelism.features, {**resolved(), "no_pipeline_parallel": True, **changed}) == message


def test_sequence_parallel_is_off_at_one_tensor_parallel_rank():
    assert parallelism.features({**resolved(), "sequence_parallel": True}) == {"sequence_parallel": False,
                                                                               "ds_pipeline_enabled": True}


def test_the_backend_is_the_devices_unless_given():
    assert parallelism.backend({**resolved(), "distributed_backend": None}, "cpu") == {"distributed_backend": "gloo"}
    assert parallelism.backend({**resolved(), "distributed_backend": "gloo"}, "tpu") == {}
    assert refusal(parallelism.backend, {**resolved(), "distributed_backend": None}, "tpu").startswith(
        "no default --distributed-backend for device 'tpu'; pass one of nccl, hccl, gloo, ccl")


def test_section():
    section = parallelism.section(resolved("--tensor-model-parallel-size", "2", world_size=4))
    assert isinstance(section, ParallelConfig)
    assert (section.tensor, section.pipeline, section.data, section.world_size, section.pipeline_engine,
            section.zero_stage, section.distributed_backend) == (2, 1, 2, 4, True, 1, "gloo")


@pytest.mark.full
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


@pytest.mark.full
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
