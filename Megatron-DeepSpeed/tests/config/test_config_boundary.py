"""The argparse Namespace stops at the config boundary: parsing makes it once, validation and the job config
return new values and never change it; the DeepSpeed JSON is read once; flags adopted from a checkpoint go through
the same section builders; generation and evaluation parse the training groups' flags."""
import copy
import json

import pytest

from megatron.config.arguments import job_config, parse_args, validate_args, with_flags
from megatron.config.ds_config import resolve_deepspeed_config
from megatron.errors import InputError

BASE = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--encoder-seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--mock-data", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "100"]


def write_json(tmp_path, config):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_validation_and_the_job_config_leave_the_parsed_namespace_unchanged(tmp_path):
    # Flags whose validation derives or rewrites values: defaults from the world size, --sequence-parallel turned
    # off at TP 1, the ramp-up as numbers, the implied DeepSpeed checkpointing, the JSON's ZeRO stage.
    args = parse_args(BASE + ["--train-samples", "640", "--rampup-batch-size", "4", "4", "64", "--global-batch-size",
                              "8", "--sequence-parallel", "--checkpoint-activations",
                              "--distribute-checkpointed-activations", "--deepspeed_config",
                              write_json(tmp_path, {"zero_optimization": {"stage": 0}})])
    before = copy.deepcopy(vars(args))
    validated = validate_args(args, 2, "cpu")
    job = job_config(validated)
    resolve_deepspeed_config(job)
    assert vars(args) == before
    assert (validated.sequence_parallel, validated.zero_stage, validated.rampup_batch_size) == (False, 0, [4, 4, 64])
    assert (validated.data_parallel_size, validated.partition_activations) == (2, True)
    assert (args.sequence_parallel, args.zero_stage, args.rampup_batch_size) == (True, None, ["4", "4", "64"])
    assert not hasattr(args, "data_parallel_size")


def test_the_deepspeed_json_is_read_once_while_the_flags_are_checked(tmp_path):
    path = write_json(tmp_path, {"zero_optimization": {"stage": 0}, "wall_clock_breakdown": True})
    job = job_config(validate_args(parse_args(BASE + ["--train-iters", "10", "--deepspeed_config", path]), 1, "cpu"))
    write_json(tmp_path, {"zero_optimization": {"stage": 3}})  # read again, this would contradict --zero-stage 0
    merged = resolve_deepspeed_config(job)
    assert (merged["zero_optimization"]["stage"], merged["wall_clock_breakdown"]) == (0, True)
    assert "deepspeed_json" not in job.flags  # checkpoints record the flags, not the JSON


def test_flags_adopted_from_a_checkpoint_go_through_the_section_builders(tmp_path):
    path = write_json(tmp_path, {"wall_clock_breakdown": True})
    job = job_config(validate_args(parse_args(BASE + ["--train-iters", "10", "--deepspeed_config", path]), 2, "cpu"))
    adopted = with_flags(job, {"lr": 0.5, "min_lr": 0.1, "lr_warmup_iters": 3, "lr_decay_style": "cosine"})
    assert (adopted.schedule.lr, adopted.schedule.min_lr, adopted.schedule.decay_style) == (0.5, 0.1, "cosine")
    assert adopted.schedule.warmup_samples == 3 * 4  # iterations x the global batch of 2 x DP 2
    assert adopted.optimizer.lr == 0.5 and adopted.flags["lr"] == 0.5
    assert (adopted.model, adopted.parallel, adopted.batch, adopted.data) == (job.model, job.parallel, job.batch,
                                                                             job.data)
    assert resolve_deepspeed_config(adopted)["wall_clock_breakdown"] is True
    assert job.schedule.lr == 1e-3  # the first job is unchanged


@pytest.mark.parametrize("tool", ["tools.generate_text", "tasks.zeroshot_gpt.evaluate"])
def test_generation_and_evaluation_parse_the_training_groups_flags(tool):
    parse = __import__(tool, fromlist=["parse_args"]).parse_args
    task = ["--task", "LAMBADA", "--valid-data", "l.jsonl"] if "zeroshot" in tool else []
    args = parse(["--load", "ckpt", *task])
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.micro_batch_size) == (1, 1, 8)
    assert (args.tokenizer_type, args.vocab_size, args.distributed_timeout_minutes) == (None, None, 10.0)
    for bad, named in ((["--distributed-timeout-minutes", "0"], "0 must be greater than 0"),
                       (["--tokenizer-type", "Word"], "--tokenizer-type"), (["--fp16", "--bf16"], "not allowed")):
        with pytest.raises(InputError, match=named):
            parse(["--load", "ckpt", *task, *bad])
