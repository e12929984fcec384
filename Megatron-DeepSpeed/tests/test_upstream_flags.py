"""Every GPT flag of Megatron-DeepSpeed b4d4a0e's arguments.py either parses or stops with one line saying the
feature is not supported; the new flags' validation and their DeepSpeed-config keys."""
import json
import os

import pytest

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.ds_config import build_deepspeed_config, resolve_deepspeed_config
from megatron.config.flags.unsupported import UNSUPPORTED_FLAGS
from megatron.errors import InputError, run_cli

BASE = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "10", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"]

# Each flag of b4d4a0e's megatron/config/arguments.py (in its order) with a non-default sample value, and whether this
# trainer accepts it ("ok") or refuses it as not supported ("no"); then the four flags
# deepspeed.add_config_arguments adds.
B4D4A0E_FLAGS = """
--num-layers 4 | ok
--num-experts 8 | ok
--mlp-type residual | ok
--topk 2 | ok
--expert-interval 1 | ok
--hidden-size 16 | ok
--ffn-hidden-size 64 | ok
--num-attention-heads 4 | ok
--kv-channels 3 | no
--max-position-embeddings 64 | ok
--make-vocab-size-divisible-by 64 | ok
--layernorm-epsilon 1e-6 | ok
--apply-residual-connection-post-layernorm | no
--openai-gelu | ok
--onnx-safe True | ok
--bert-no-binary-head | no
--log-params-norm | ok
--log-num-zeros-in-grad | ok
--tensorboard-log-interval 5 | ok
--tensorboard-queue-size 10 | ok
--log-timers-to-tensorboard | ok
--log-batch-size-to-tensorboard | ok
--no-log-learnig-rate-to-tensorboard | ok
--no-log-loss-scale-to-tensorboard | ok
--log-validation-ppl-to-tensorboard | ok
--log-optimizer-states-to-tensorboard | ok
--attention-dropout 0.2 | ok
--hidden-dropout 0.2 | ok
--weight-decay 0.1 | ok
--clip-grad 0.5 | ok
--adam-beta1 0.8 | ok
--adam-beta2 0.95 | ok
--adam-eps 1e-6 | ok
--sgd-momentum 0.5 | ok
--micro-batch-size 4 | ok
--batch-size 4 | no
--global-batch-size 16 | ok
--rampup-batch-size 4 4 100 | ok
--checkpoint-activations | ok
--distribute-checkpointed-activations | ok
--checkpoint-num-layers 2 | ok
--train-iters 20 | ok
--train-samples 100 | ok
--train-tokens 1000 | ok
--log-interval 10 | ok
--exit-interval 10 | ok
--exit-duration-in-mins 30 | ok
--tensorboard-dir tb | ok
--no-masked-softmax-fusion | ok
--no-bias-gelu-fusion | ok
--no-bias-dropout-fusion | ok
--disable-moe-token-dropping | ok
--moe-train-capacity-factor 2.0 | ok
--moe-eval-capacity-factor 2.0 | ok
--moe-min-capacity 8 | ok
--moe-loss-coeff 0.01 | ok
--create-moe-param-group | ok
--optimizer sgd | ok
--dataloader-type cyclic | ok
--ds-inference | no
--cpu-optimizer | ok
--cpu_torch_adam | ok
--no-pipeline-parallel | ok
--use-tutel | ok
--inference | no
--seed 42 | ok
--init-method-std 0.01 | ok
--init-method-xavier-uniform | ok
--lr 0.01 | ok
--lr-decay-style cosine | ok
--lr-decay-iters 8 | ok
--lr-decay-samples 50 | ok
--lr-decay-tokens 5000 | ok
--lr-warmup-fraction 0.1 | ok
--lr-warmup-iters 2 | ok
--lr-warmup-samples 10 | ok
--lr-warmup-tokens 500 | ok
--warmup 5 | no
--min-lr 1e-5 | ok
--override-lr-scheduler | ok
--use-checkpoint-lr-scheduler | ok
--save ckpt | ok
--save-interval 5 | ok
--no-save-optim | ok
--no-save-rng | ok
--load ckpt | ok
--no-load-optim | ok
--no-load-rng | ok
--no-load-lr-state | ok
--finetune | ok
--fp16 | ok
--bf16 | ok
--loss-scale 1024 | ok
--initial-loss-scale 65536 | ok
--min-loss-scale 2 | ok
--loss-scale-window 500 | ok
--hysteresis 4 | ok
--fp32-residual-connection | ok
--no-query-key-layer-scaling | ok
--attention-softmax-in-fp32 | ok
--accumulate-allreduce-grads-in-fp32 | ok
--fp16-lm-cross-entropy | no
--tensor-model-parallel-size 2 | ok
--enable-expert-tensor-parallelism | ok
--pipeline-model-parallel-size 2 | ok
--moe-expert-parallel-size 2 | ok
--model-parallel-size 2 | no
--num-layers-per-virtual-pipeline-stage 2 | no
--distributed-backend gloo | ok
--DDP-impl torch | ok
--use-contiguous-buffers-in-ddp | ok
--no-scatter-gather-tensors-in-pipeline | ok
--local_rank 1 | ok
--lazy-mpu-init True | no
--use-cpu-initialization | ok
--eval-iters 5 | ok
--eval-interval 50 | ok
--aml-data-download-path /mnt/data | no
--data-path corpus_text_document | ok
--split 90,5,5 | ok
--vocab-file vocab.json | ok
--merge-file merges.txt | ok
--vocab-extra-ids 100 | no
--seq-length 32 | ok
--encoder-seq-length 16 | ok
--decoder-seq-length 16 | no
--retriever-seq-length 128 | no
--sample-rate 0.5 | no
--mask-prob 0.2 | no
--short-seq-prob 0.2 | no
--mmap-warmup | ok
--num-workers 0 | ok
--tokenizer-type GPT2BPETokenizer | ok
--data-impl mmap | ok
--reset-position-ids | ok
--reset-attention-mask | ok
--eod-mask-loss | ok
--adlr-autoresume | no
--adlr-autoresume-interval 10 | ok
--ict-head-size 128 | no
--biencoder-projection-dim 128 | no
--biencoder-shared-query-context-model | no
--ict-load ict | no
--bert-load bert | no
--titles-data-path titles | no
--query-in-block-prob 0.5 | no
--use-one-sent-docs | no
--evidence-data-path evidence | no
--retriever-report-topk-accuracies 1 5 | no
--retriever-score-scaling | no
--block-data-path blocks | no
--embedding-path embeddings | no
--indexer-batch-size 64 | no
--indexer-log-interval 10 | no
--num-classes 10 | no
--img-dim 32 | no
--num-channels 1 | no
--patch-dim 8 | no
--zero-stage 2 | ok
--zero-reduce-scatter | ok
--zero-contigious-gradients | ok
--zero-reduce-bucket-size 50000000 | ok
--zero-allgather-bucket-size 50000000 | ok
--remote-device cpu | ok
--use-pin-memory | ok
--scattered-embeddings | no
--split-transformers | no
--memory-centric-tiled-linear | no
--tile-factor 2 | ok
--deepspeed-activation-checkpointing | ok
--partition-activations | ok
--contigious-checkpointing | ok
--checkpoint-in-cpu | ok
--synchronize-each-layer | ok
--profile-backward | ok
--num-layers-teacher 2 | ok
--num-experts-teacher 2 | ok
--hidden-size-teacher 8 | ok
--num-attention-heads-teacher 2 | ok
--mos | no
--kd | no
--kd-alpha-ce 0.5 | ok
--kd-beta-ce 0.5 | ok
--kd-temp 2.0 | ok
--reset-iteration | ok
--load-teacher teacher | ok
--deepspeed | ok
--deepspeed_config ds.json | ok
--deepscale | ok
--deepscale_config ds.json | ok
"""
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
    args = parse_args(BASE + ["--num-experts", "1", "--moe-loss-coeff", "0.01", "--topk", "2", "--kv-channels", "4",
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
    """README.md for b4d4a0e's flags, docs/upstream-main.md for those upstream main added."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    pages = "".join(open(os.path.join(root, page), encoding="utf-8").read()
                    for page in ("README.md", os.path.join("docs", "upstream-main.md")))
    missing = [entry.flag for entry in UNSUPPORTED_FLAGS if f"`{entry.flag}`" not in pages]
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
    (["--log-num-zeros-in-grad"], "--zero-stage 0 without --fp16/--bf16"),
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
    assert (args.zero_stage, args.remote_device, args.timing_log_level) == (1, "none", 0)


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


def test_json_curriculum_learning_is_refused_and_a_disabled_section_dropped(tmp_path):
    disabled = write_json(tmp_path, {"curriculum_learning": {"enabled": False, "min_difficulty": 8}})
    assert "curriculum_learning" not in resolve_deepspeed_config(job("--deepspeed_config", disabled))
    enabled = write_json(tmp_path, {"curriculum_learning": {"enabled": True}})
    with pytest.raises(InputError, match="curriculum_learning: Megatron-DeepSpeed's curriculum learning is not"):
        resolve_deepspeed_config(job("--deepspeed_config", enabled))


def test_sgd_under_zero_is_allowed_explicitly():
    assert build_deepspeed_config(job("--optimizer", "sgd"))["zero_allow_untested_optimizer"] is True
    assert "zero_allow_untested_optimizer" not in build_deepspeed_config(job())
