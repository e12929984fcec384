"""Every GPT flag of Megatron-DeepSpeed b4d4a0e's arguments.py either parses or stops with one line saying the
feature is not supported; the new flags' validation and their DeepSpeed-config keys."""
import json
import os

import pytest

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.ds_config import build_deepspeed_config, resolve_deepspeed_config
from megatron.config.flags.unsupported import UNSUPPORTED_FLAGS
from megatron.config.upstream_flags import B4D4A0E_FLAGS
from megatron.errors import InputError, run_cli
from tests.helpers.paths import DOCS

BASE = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "10", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"]

# Flags of later Megatron-DeepSpeed versions that the issue names.
LATER_FLAGS = """
--apply-query-key-layer-scaling | ok
--no-gradient-accumulation-fusion | ok
--use-flash-attn | ok
--use-flash-attn-v2 | ok
--log-memory-to-tensorboard | ok
--timing-log-level 2 | ok
--local-rank 0 | ok
--exit-signal-handler | ok
--distributed-timeout-minutes 5 | ok
"""


def table(text):
    rows = [line.split(" | ") for line in text.strip().splitlines()]
    return [(usage.split(), outcome) for usage, outcome in rows]


def test_the_table_holds_all_of_b4d4a0es_flags():
    flags = [usage[0] for usage, _ in table(B4D4A0E_FLAGS)]
    assert len(flags) == len(set(flags)) == 186 + 4


@pytest.mark.parametrize("usage, outcome", table(B4D4A0E_FLAGS) + table(LATER_FLAGS),
                         ids=[usage[0] for usage, _ in table(B4D4A0E_FLAGS) + table(LATER_FLAGS)])
def test_upstream_flag_parses_or_is_refused_in_one_line(usage, outcome):
    if outcome == "ok":
        parse_args(BASE + usage)
        return
    with pytest.raises(InputError) as caught:
        parse_args(BASE + usage)
    message = str(caught.value)
    assert message.startswith(usage[0] + ": Megatron-DeepSpeed") and "\n" not in message
    assert message.endswith("is not supported by this trainer") or "no longer accepts it; use --" in message


def test_unsupported_flags_at_values_that_leave_their_feature_off_are_inert():
    # The dense GPT scripts pass MoE flags with one expert; a knob never turns its feature on by itself.
    args = parse_args(BASE + ["--num-experts", "1", "--moe-loss-coeff", "0.01", "--topk", "2",
                              "--kd-temp", "2", "--num-classes", "1000"])
    assert not any(hasattr(args, entry.dest) for entry in UNSUPPORTED_FLAGS)


def test_mixture_of_experts_on_the_pipeline_engine_stops_with_exactly_one_line(capsys):
    from pretrain_gpt import main
    with pytest.raises(SystemExit) as caught:
        run_cli(main, BASE + ["--num-experts", "8"])
    assert caught.value.code == 2
    assert capsys.readouterr().err == ("error: --num-experts above 1 needs DeepSpeed's plain engine: its pipeline "
                                       "engine does not carry the MoE loss between stages (upstream runs MoE so "
                                       "too); add --no-pipeline-parallel and use --pipeline-model-parallel-size 1\n")


def test_argparse_errors_are_one_line_without_usage(capsys):
    from pretrain_gpt import main
    for bad in (["--num-layer", "2"], ["--data-impl", "raw"]):
        with pytest.raises(SystemExit):
            run_cli(main, BASE + bad)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and "usage" not in err
        assert bad[0] in err


def test_the_documentation_lists_every_unsupported_flag():
    """docs/upstream-compatibility.md for b4d4a0e's flags, docs/upstream-main.md for those upstream main added."""
    docs = DOCS
    text = "".join(open(os.path.join(docs, page), encoding="utf-8").read()
                   for page in ("upstream-compatibility.md", "upstream-main.md"))
    missing = [entry.flag for entry in UNSUPPORTED_FLAGS if f"`{entry.flag}`" not in text]
    assert not missing


# --- validation of the new flags -------------------------------------------------------------------------

def validated(*extra, world_size=1, device="cpu"):
    return validate_args(parse_args(BASE + list(extra)), world_size, device)


def job(*extra):
    return job_config(validated(*extra))


@pytest.mark.parametrize("extra, message", [
    (["--rampup-batch-size", "4", "4"], "give three numbers, START INCREMENT SAMPLES"),
    (["--rampup-batch-size", "4", "4", "100", "--global-batch-size", "16"], "give the training length as "
                                                                            "--train-samples instead of"),
    (["--fp32-residual-connection"], "add --fp16 or --bf16"),
    (["--log-num-zeros-in-grad", "--zero-stage", "1"], "--zero-stage 0 without --fp16/--bf16"),
    (["--contigious-checkpointing", "--checkpoint-activations"], "add --partition-activations"),
    (["--distribute-checkpointed-activations"], "add --checkpoint-activations"),
    (["--remote-device", "cpu"], "use --zero-stage 3"),
    (["--lr-decay-tokens", "100", "--lr-warmup-tokens", "200"], "must be longer than --lr-warmup-tokens 200"),
    (["--seq-length", "16", "--encoder-seq-length", "32"], "name the same length"),
])
def test_new_flags_are_validated_with_clear_messages(extra, message):
    with pytest.raises(InputError) as caught:
        validated(*extra)
    assert message in str(caught.value)


@pytest.mark.parametrize("ramp, message", [(["4", "8", "100"], "16 - 4 must be a non-negative multiple of 8"),
                                           (["1", "3", "100"], "START 1 is not a multiple of --micro-batch-size 2")])
def test_rampup_must_reach_the_global_batch_in_whole_micro_batch_steps(ramp, message):
    in_samples = [flag if flag != "--train-iters" else "--train-samples" for flag in BASE]
    with pytest.raises(InputError) as caught:
        validate_args(parse_args(in_samples + ["--rampup-batch-size", *ramp, "--global-batch-size", "16"]), 1, "cpu")
    assert message in str(caught.value)


def test_upstream_defaults_of_new_flags():
    args = validated()
    assert (args.data_impl, args.dataloader_type, args.optimizer, args.sgd_momentum) == ("infer", "single", "adam",
                                                                                          0.9)
    assert (args.layernorm_epsilon, args.apply_query_key_layer_scaling, args.masked_softmax_fusion) == (1e-5, True,
                                                                                                       True)
    assert (args.checkpoint_num_layers, args.tensorboard_log_interval, args.tensorboard_queue_size) == (1, 1, 1000)
    assert (args.log_learning_rate_to_tensorboard, args.log_loss_scale_to_tensorboard) == (True, True)
    assert (args.remote_device, args.timing_log_level) == ("none", 0)
    assert validated(world_size=2).zero_stage == 1  # upstream's ZeRO stage; one data-parallel rank gets 0


def test_encoder_seq_length_is_seq_length():
    without_seq_length = BASE[:6] + BASE[8:]
    assert "--seq-length" not in without_seq_length
    args = validate_args(parse_args(without_seq_length + ["--encoder-seq-length", "24"]), 1, "cpu")
    assert args.seq_length == 24


# --- DeepSpeed config keys ---------------------------------------------------------------------------------

def test_zero_flags_become_deepspeed_config_keys():
    config = build_deepspeed_config(job(
        "--zero-stage", "3", "--no-pipeline-parallel", "--zero-reduce-scatter", "--zero-contigious-gradients",
        "--zero-reduce-bucket-size", "5000", "--zero-allgather-bucket-size", "7000", "--remote-device", "cpu",
        "--use-pin-memory"))
    assert config["zero_optimization"] == {
        "stage": 3, "reduce_scatter": True, "contiguous_gradients": True, "reduce_bucket_size": 5000,
        "allgather_bucket_size": 7000, "offload_param": {"device": "cpu", "pin_memory": True}}
    assert "reduce_bucket_size" not in build_deepspeed_config(job())["zero_optimization"]


def write_json(tmp_path, config):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_a_json_may_not_contradict_a_zero_flag(tmp_path):
    path = write_json(tmp_path, {"zero_optimization": {"stage": 1, "reduce_bucket_size": 100}})
    with pytest.raises(InputError, match="reduce_bucket_size=100 but --zero-reduce-bucket-size is 5000"):
        resolve_deepspeed_config(job("--deepspeed_config", path, "--zero-reduce-bucket-size", "5000"))


def test_zero_stage_comes_from_the_json_unless_given(tmp_path):
    path = write_json(tmp_path, {"zero_optimization": {"stage": 0}})
    assert validated("--deepspeed_config", path).zero_stage == 0
    with pytest.raises(InputError, match="zero_optimization.stage=0 but --zero-stage is 2"):
        resolve_deepspeed_config(job("--deepspeed_config", path, "--zero-stage", "2", "--no-pipeline-parallel"))


def test_json_curriculum_learning_goes_to_the_loop_never_to_deepspeed(tmp_path):
    disabled = write_json(tmp_path, {"curriculum_learning": {"enabled": False, "min_difficulty": 8}})
    assert "curriculum_learning" not in resolve_deepspeed_config(job("--deepspeed_config", disabled))
    assert job("--deepspeed_config", disabled).curriculum is None
    enabled = write_json(tmp_path, {"curriculum_learning": {
        "enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 16,
        "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}}})
    assert "curriculum_learning" not in resolve_deepspeed_config(job("--deepspeed_config", enabled))
    assert job("--deepspeed_config", enabled).curriculum["max_difficulty"] == 16


def test_sgd_under_zero_is_allowed_explicitly():
    assert build_deepspeed_config(job("--optimizer", "sgd", "--zero-stage", "1"))["zero_allow_untested_optimizer"]
    assert "zero_allow_untested_optimizer" not in build_deepspeed_config(job("--zero-stage", "1"))
