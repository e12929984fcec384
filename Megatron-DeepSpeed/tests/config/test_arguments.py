"""Flags parse to Megatron's attributes and defaults; validation explains every inconsistency."""
import logging

import pytest
import torch

from megatron.config.arguments import job_config, model_flag_argv, parse_args, validate_args
from megatron.config.model_config import ARCHITECTURE_FLAGS, ModelConfig
from megatron.errors import InputError

# A small valid command line; tests add flags or drop some of these.
BASE = {
    "--num-layers": ["2"], "--hidden-size": ["8"], "--num-attention-heads": ["2"],
    "--seq-length": ["16"], "--micro-batch-size": ["2"], "--lr": ["1e-3"],
    "--train-iters": ["10"], "--mock-data": [], "--tokenizer-type": ["NullTokenizer"],
    "--vocab-size": ["100"],
}


def argv(*extra, drop=()):
    line = []
    for name, values in BASE.items():
        if name not in drop:
            line += [name, *values]
    return line + list(extra)


def validated(*extra, drop=(), world_size=1, device="cpu"):
    return validate_args(parse_args(argv(*extra, drop=drop)), world_size, device)


def error_of(*extra, drop=(), world_size=1, device="cpu"):
    with pytest.raises(InputError) as caught:
        validated(*extra, drop=drop, world_size=world_size, device=device)
    return str(caught.value)


def assert_names(message, *parts):
    for part in parts:
        assert part in message, f"{part!r} missing from: {message}"


# ----------------------------------------------------------------------------- parsing

DEFAULTS = {
    "model_size": None, "ffn_hidden_size": None, "max_position_embeddings": None,
    "make_vocab_size_divisible_by": 128, "init_method_std": 0.02, "hidden_dropout": 0.1,
    "attention_dropout": 0.1, "openai_gelu": False, "global_batch_size": None,
    "train_samples": None, "checkpoint_activations": False, "weight_decay": 0.01,
    "clip_grad": 1.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8,
    "cpu_optimizer": False, "seed": 1234, "exit_interval": None, "min_lr": 0.0,
    "lr_decay_style": "linear", "lr_decay_iters": None, "lr_decay_samples": None,
    "lr_warmup_fraction": None, "lr_warmup_iters": None, "lr_warmup_samples": None,
    "fp16": False, "bf16": False, "loss_scale": None, "initial_loss_scale": 2.0 ** 32,
    "min_loss_scale": 1.0, "loss_scale_window": 1000, "hysteresis": 2, "data_path": None,
    "split": "969, 30, 1", "data_cache_path": None, "num_workers": 2, "vocab_file": None,
    "merge_file": None, "tokenizer_model": None, "eod_mask_loss": False,
    "reset_position_ids": False, "reset_attention_mask": False, "save": None, "load": None,
    "save_interval": None, "eval_interval": 1000, "eval_iters": 100, "log_interval": 100,
    "tensorboard_dir": None, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
    "sequence_parallel": False, "no_pipeline_parallel": False, "distributed_backend": None,
    "deepspeed": False, "deepspeed_config": None, "zero_stage": None, "local_rank": None,
}


def test_defaults_without_flags():
    args = parse_args(argv())
    for dest, expected in DEFAULTS.items():
        assert getattr(args, dest) == expected, dest
        assert type(getattr(args, dest)) is type(expected), dest


def test_default_tokenizer_is_gpt2_bpe():
    assert parse_args(argv(drop=("--tokenizer-type",))).tokenizer_type == "GPT2BPETokenizer"


FLAGS = [
    (["--num-layers", "24"], "num_layers", 24),
    (["--hidden-size", "1024"], "hidden_size", 1024),
    (["--num-attention-heads", "16"], "num_attention_heads", 16),
    (["--ffn-hidden-size", "3000"], "ffn_hidden_size", 3000),
    (["--seq-length", "1024"], "seq_length", 1024),
    (["--max-position-embeddings", "2048"], "max_position_embeddings", 2048),
    (["--micro-batch-size", "4"], "micro_batch_size", 4),
    (["--global-batch-size", "64"], "global_batch_size", 64),
    (["--train-iters", "500000"], "train_iters", 500000),
    (["--train-samples", "1000"], "train_samples", 1000),
    (["--lr", "1.5e-4"], "lr", 1.5e-4),
    (["--min-lr", "1.5e-5"], "min_lr", 1.5e-5),
    (["--lr-decay-style", "cosine"], "lr_decay_style", "cosine"),
    (["--lr-decay-iters", "320000"], "lr_decay_iters", 320000),
    (["--lr-decay-samples", "9000"], "lr_decay_samples", 9000),
    (["--lr-warmup-fraction", "0.01"], "lr_warmup_fraction", 0.01),
    (["--lr-warmup-iters", "5"], "lr_warmup_iters", 5),
    (["--lr-warmup-samples", "50"], "lr_warmup_samples", 50),
    (["--weight-decay", "0.1"], "weight_decay", 0.1),
    (["--clip-grad", "0.5"], "clip_grad", 0.5),
    (["--adam-beta1", "0.8"], "adam_beta1", 0.8),
    (["--adam-beta2", "0.95"], "adam_beta2", 0.95),
    (["--adam-eps", "1e-6"], "adam_eps", 1e-6),
    (["--init-method-std", "0.006"], "init_method_std", 0.006),
    (["--hidden-dropout", "0"], "hidden_dropout", 0.0),
    (["--attention-dropout", "0.2"], "attention_dropout", 0.2),
    (["--fp16"], "fp16", True),
    (["--bf16"], "bf16", True),
    (["--loss-scale", "128"], "loss_scale", 128.0),
    (["--initial-loss-scale", "65536"], "initial_loss_scale", 65536.0),
    (["--min-loss-scale", "2"], "min_loss_scale", 2.0),
    (["--loss-scale-window", "500"], "loss_scale_window", 500),
    (["--hysteresis", "4"], "hysteresis", 4),
    (["--checkpoint-activations"], "checkpoint_activations", True),
    (["--no-checkpoint-activations"], "checkpoint_activations", False),
    (["--data-path", "corpus_text_document"], "data_path", ["corpus_text_document"]),
    (["--data-path", "0.3", "a", "0.7", "b"], "data_path", ["0.3", "a", "0.7", "b"]),
    (["--split", "949,50,1"], "split", "949,50,1"),
    (["--vocab-file", "v.json"], "vocab_file", "v.json"),
    (["--merge-file", "m.txt"], "merge_file", "m.txt"),
    (["--tokenizer-type", "SentencePieceTokenizer"], "tokenizer_type", "SentencePieceTokenizer"),
    (["--tokenizer-type", "GPTSentencePieceTokenizer"], "tokenizer_type",
     "GPTSentencePieceTokenizer"),
    (["--tokenizer-model", "sp.model"], "tokenizer_model", "sp.model"),
    (["--vocab-size", "50257"], "vocab_size", 50257),
    (["--data-cache-path", "/cache"], "data_cache_path", "/cache"),
    (["--save", "ckpt"], "save", "ckpt"),
    (["--load", "ckpt"], "load", "ckpt"),
    (["--save-interval", "500"], "save_interval", 500),
    (["--eval-interval", "50"], "eval_interval", 50),
    (["--eval-iters", "7"], "eval_iters", 7),
    (["--log-interval", "1"], "log_interval", 1),
    (["--exit-interval", "30"], "exit_interval", 30),
    (["--tensorboard-dir", "tb"], "tensorboard_dir", "tb"),
    (["--seed", "42"], "seed", 42),
    (["--num-workers", "0"], "num_workers", 0),
    (["--distributed-backend", "hccl"], "distributed_backend", "hccl"),
    (["--deepspeed"], "deepspeed", True),
    (["--deepspeed_config", "ds.json"], "deepspeed_config", "ds.json"),
    (["--zero-stage", "3"], "zero_stage", 3),
    (["--make-vocab-size-divisible-by", "64"], "make_vocab_size_divisible_by", 64),
    (["--openai-gelu"], "openai_gelu", True),
    (["--eod-mask-loss"], "eod_mask_loss", True),
    (["--reset-position-ids"], "reset_position_ids", True),
    (["--reset-attention-mask"], "reset_attention_mask", True),
    (["--mock-data"], "mock_data", True),
    (["--tensor-model-parallel-size", "2"], "tensor_model_parallel_size", 2),
    (["--pipeline-model-parallel-size", "4"], "pipeline_model_parallel_size", 4),
    (["--sequence-parallel"], "sequence_parallel", True),
    (["--no-pipeline-parallel"], "no_pipeline_parallel", True),
    (["--cpu-optimizer"], "cpu_optimizer", True),
    (["--local_rank", "3"], "local_rank", 3),
    (["--local-rank=5"], "local_rank", 5),
    (["--model-size", "345M"], "model_size", "345M"),
]


@pytest.mark.parametrize("flags, dest, expected", FLAGS, ids=[f[0][0] for f in FLAGS])
def test_flag_sets_attribute(flags, dest, expected):
    value = getattr(parse_args(argv(*flags)), dest)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("flags", [["--num-layers", "two"], ["--zero-stage", "4"],
                                   ["--lr-decay-style", "exponential"],
                                   ["--model-size", "7B"], ["--num-layer", "2"]])
def test_malformed_values_are_one_line_input_errors(flags):
    with pytest.raises(InputError) as caught:
        parse_args(argv(*flags))
    assert flags[0] in str(caught.value) and "\n" not in str(caught.value)


def test_extra_args_provider_adds_script_flags():
    def provider(parser):
        parser.add_argument("--my-flag", type=int, default=7)
        return parser
    assert parse_args(argv("--my-flag", "9"), extra_args_provider=provider).my_flag == 9
    assert parse_args(argv(), extra_args_provider=provider).my_flag == 7


# ----------------------------------------------------------------------------- --model-size

def test_model_size_fills_fields_not_given():
    args = parse_args(argv("--model-size", "1.3B", drop=BASE))
    assert (args.num_layers, args.hidden_size, args.num_attention_heads, args.seq_length) == \
        (24, 2048, 16, 1024)
    assert (args.micro_batch_size, args.global_batch_size, args.lr, args.min_lr) == \
        (8, 32, 2e-4, 2e-5)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (2, 2)
    assert args.checkpoint_activations is True
    assert (args.lr_decay_style, args.lr_warmup_fraction, args.split) == \
        ("cosine", 0.01, "949,50,1")
    assert (args.hidden_dropout, args.attention_dropout) == (0.0, 0.0)
    assert (args.train_iters, args.lr_decay_iters) == (500000, 320000)


def test_explicit_flags_win_over_model_size():
    args = parse_args(argv("--model-size", "1.3B", "--num-layers", "4", "--lr", "0.5",
                           "--tensor-model-parallel-size", "1", "--hidden-dropout", "0.1",
                           "--no-checkpoint-activations", "--split", "90,5,5", drop=BASE))
    assert (args.num_layers, args.lr, args.tensor_model_parallel_size) == (4, 0.5, 1)
    assert (args.hidden_dropout, args.checkpoint_activations, args.split) == \
        (0.1, False, "90,5,5")
    assert args.hidden_size == 2048


def test_model_size_respects_chosen_alternatives():
    args = parse_args(argv("--model-size", "345M", "--train-samples", "1000",
                           "--lr-warmup-samples", "10", drop=BASE))
    assert (args.train_iters, args.lr_decay_iters, args.lr_warmup_fraction) == (None, None, None)
    assert args.train_samples == 1000
    args = parse_args(argv("--model-size", "345M", "--lr-warmup-iters", "0", drop=BASE))
    assert args.lr_warmup_fraction is None


# ----------------------------------------------------------------------------- derived values

def test_derived_values():
    args = validated("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                     "--global-batch-size", "12", world_size=12)
    assert args.world_size == 12
    assert args.data_parallel_size == 3           # 12 / (2 x 2)
    assert args.num_micro_batches == 2            # 12 / (2 x 3)
    assert args.ffn_hidden_size == 32             # 4 x 8
    assert args.max_position_embeddings == 16     # = seq length
    assert args.lr_decay_iters == 10              # = train iters
    assert (args.lr_warmup_iters, args.lr_warmup_samples) == (0, 0)
    assert args.ds_pipeline_enabled is True


def test_global_batch_defaults_to_micro_times_data_parallel():
    args = validated(world_size=4)
    assert args.global_batch_size == 8
    assert args.num_micro_batches == 1


def test_sample_based_decay_defaults_to_train_samples():
    args = validated("--train-samples", "640", drop=("--train-iters",))
    assert (args.lr_decay_samples, args.lr_decay_iters) == (640, None)


@pytest.mark.parametrize("flags, device, dtype", [
    ([], "cpu", torch.float32), (["--bf16"], "cpu", torch.bfloat16),
    (["--fp16"], "cuda", torch.float16), (["--fp16"], "npu", torch.float16)])
def test_params_dtype(flags, device, dtype):
    assert job_config(validated(*flags, device=device)).precision.params_dtype == dtype


@pytest.mark.parametrize("device, backend", [("cuda", "nccl"), ("npu", "hccl"), ("cpu", "gloo")])
def test_backend_chosen_by_device(device, backend):
    assert validated(device=device).distributed_backend == backend


def test_explicit_backend_kept():
    assert validated("--distributed-backend", "gloo", device="cuda").distributed_backend == "gloo"


def test_validation_is_repeatable():
    args = validated("--lr-warmup-fraction", "0.1", world_size=2)
    assert validate_args(args, 2, "cpu").global_batch_size == 4


# ----------------------------------------------------------------------------- validation rules

def test_global_batch_not_divisible_by_micro_times_dp():
    message = error_of("--global-batch-size", "12", world_size=4)
    assert_names(message, "--global-batch-size 12", "--micro-batch-size 2",
                 "data parallel size 4", "= 8", "8 or 16")


def test_world_size_not_divisible_by_tp_times_pp():
    message = error_of("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                       world_size=6)
    assert_names(message, "world size 6", "--tensor-model-parallel-size 2",
                 "--pipeline-model-parallel-size 2", "multiple of 4")


def test_seq_length_above_max_position_embeddings():
    message = error_of("--max-position-embeddings", "8")
    assert_names(message, "--seq-length 16", "--max-position-embeddings 8")


def test_hidden_not_divisible_by_heads():
    message = error_of("--hidden-size", "10", "--num-attention-heads", "4")
    assert_names(message, "--hidden-size 10", "--num-attention-heads 4")


def test_heads_not_divisible_by_tp():
    message = error_of("--tensor-model-parallel-size", "4", world_size=4)
    assert_names(message, "--num-attention-heads 2", "--tensor-model-parallel-size 4")


def test_ffn_not_divisible_by_tp():
    message = error_of("--tensor-model-parallel-size", "2", "--ffn-hidden-size", "33",
                       world_size=2)
    assert_names(message, "--ffn-hidden-size 33", "--tensor-model-parallel-size 2")


def test_fp16_on_cpu():
    assert_names(error_of("--fp16", device="cpu"), "--fp16", "'cpu'", "--bf16", "fp32")


def test_fp16_and_bf16_together():
    assert_names(error_of("--fp16", "--bf16", device="cuda"), "--fp16", "--bf16")


def test_train_iters_and_train_samples_both():
    message = error_of("--train-samples", "100")
    assert_names(message, "--train-iters 10", "--train-samples 100", "exactly one")


def test_train_iters_and_train_samples_neither():
    assert_names(error_of(drop=("--train-iters",)), "--train-iters", "--train-samples",
                 "neither")


def test_missing_data_path_without_mock_data():
    assert_names(error_of(drop=("--mock-data",)), "--data-path", "--mock-data")


def test_mock_data_with_data_path():
    assert_names(error_of("--data-path", "corpus"), "--mock-data", "--data-path corpus")


def test_data_path_odd_number_of_values():
    message = error_of("--data-path", "0.5", "a", "b", drop=("--mock-data",))
    assert_names(message, "--data-path 0.5 a b", "pairs", "3 values")


def test_data_path_weight_not_a_number():
    message = error_of("--data-path", "a", "b", drop=("--mock-data",))
    assert_names(message, "weight 'a'", "--data-path 0.3 prefixA 0.7 prefixB")


def test_data_path_accepts_one_prefix_or_weighted_pairs():
    assert validated("--data-path", "a", drop=("--mock-data",)).data_path == ["a"]
    assert validated("--data-path", "1", "a", "2", "b", drop=("--mock-data",)).data_path == \
        ["1", "a", "2", "b"]


@pytest.mark.parametrize("split", ["a,b,c", "1,2,3,4", "-1,2,0", "0,0,0"])
def test_bad_split(split):
    assert_names(error_of(f"--split={split}"), f"--split {split!r}")


@pytest.mark.parametrize("split", ["949,50,1", "969, 30, 1", "90/5/5", "1"])
def test_good_split(split):
    assert validated("--split", split).split == split


def test_gpt2_tokenizer_without_vocab_file(tmp_path):
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\n")
    message = error_of("--tokenizer-type", "GPT2BPETokenizer", "--merge-file", str(merges))
    assert_names(message, "--tokenizer-type GPT2BPETokenizer", "--vocab-file")


def test_gpt2_tokenizer_without_merge_file(tmp_path):
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    message = error_of("--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(vocab))
    assert_names(message, "--tokenizer-type GPT2BPETokenizer", "--merge-file")


def test_gpt2_tokenizer_files_must_exist(tmp_path):
    missing = str(tmp_path / "nope.json")
    message = error_of("--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", missing,
                       "--merge-file", missing)
    assert_names(message, f"--vocab-file {missing}", "does not exist")


def test_gpt2_tokenizer_with_files(tmp_path):
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_text("x")
    args = validated("--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                     str(tmp_path / "vocab.json"), "--merge-file", str(tmp_path / "merges.txt"))
    assert args.tokenizer_type == "GPT2BPETokenizer"


def test_sentencepiece_without_model():
    message = error_of("--tokenizer-type", "SentencePieceTokenizer")
    assert_names(message, "--tokenizer-type SentencePieceTokenizer", "--tokenizer-model")


def test_null_tokenizer_without_vocab_size():
    assert_names(error_of(drop=("--vocab-size",)), "NullTokenizer", "--vocab-size")


def test_sequence_parallel_with_tp1_warns_and_turns_off(caplog):
    with caplog.at_level(logging.WARNING, logger="megatron.config.arguments"):
        args = validated("--sequence-parallel")
    assert args.sequence_parallel is False
    assert "--sequence-parallel" in caplog.text and "turning it off" in caplog.text


def test_sequence_parallel_with_tp2_stays_on():
    args = validated("--sequence-parallel", "--tensor-model-parallel-size", "2", world_size=2)
    assert args.sequence_parallel is True


def test_sequence_parallel_needs_seq_length_divisible_by_tp():
    message = error_of("--sequence-parallel", "--tensor-model-parallel-size", "2",
                       "--seq-length", "15", world_size=2)
    assert_names(message, "--seq-length 15", "--tensor-model-parallel-size 2")


@pytest.mark.parametrize("flags, parts", [
    (["--zero-stage", "2", "--no-pipeline-parallel"], ["--zero-stage 2", "use --zero-stage 0 or 1"]),
    (["--zero-stage", "3", "--no-pipeline-parallel"], ["--zero-stage 3", "use --zero-stage 0 or 1"]),
    (["--bf16", "--zero-stage", "0"], ["--bf16 and --zero-stage 0 on the pipeline engine", "use --zero-stage 1"]),
], ids=["zero2", "zero3", "bf16-zero0-pipeline"])
def test_sequence_parallel_refuses_deepspeed_modes_that_take_gradients_during_backward(flags, parts):
    tp2 = ["--sequence-parallel", "--tensor-model-parallel-size", "2"]
    assert_names(error_of(*tp2, *flags, world_size=2), "--sequence-parallel", *parts)
    validated(*tp2, *flags, "--zero-stage", "1", world_size=2)  # the last --zero-stage wins


def test_no_pipeline_parallel_with_pp2():
    message = error_of("--no-pipeline-parallel", "--pipeline-model-parallel-size", "2",
                       world_size=2)
    assert_names(message, "--no-pipeline-parallel", "--pipeline-model-parallel-size 2")


def test_lr_below_min_lr():
    assert_names(error_of("--min-lr", "0.01"), "--lr 0.001", "--min-lr 0.01")


def test_warmup_iters_longer_than_decay():
    message = error_of("--lr-warmup-iters", "20")
    assert_names(message, "--lr-warmup-iters 20", "--lr-decay-iters 10")


def test_warmup_samples_longer_than_decay():
    message = error_of("--train-samples", "100", "--lr-decay-samples", "50",
                       "--lr-warmup-samples", "60", drop=("--train-iters",))
    assert_names(message, "--lr-warmup-samples 60", "--lr-decay-samples 50")


def test_warmup_fraction_above_one():
    assert_names(error_of("--lr-warmup-fraction", "1.5"), "--lr-warmup-fraction 1.5")


def test_more_than_one_warmup():
    message = error_of("--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2")
    assert_names(message, "--lr-warmup-fraction 0.1", "--lr-warmup-iters 2")


def test_sample_based_flag_with_iteration_training():
    message = error_of("--lr-decay-samples", "100")
    assert_names(message, "--lr-decay-samples 100", "--train-iters 10", "--lr-decay-iters")


@pytest.mark.parametrize("flags", [
    ["--num-layers", "0"], ["--hidden-size", "-8"], ["--num-attention-heads", "0"],
    ["--seq-length", "0"], ["--micro-batch-size", "0"], ["--global-batch-size", "-2"],
    ["--train-iters", "0"], ["--tensor-model-parallel-size", "0"],
    ["--pipeline-model-parallel-size", "-1"], ["--ffn-hidden-size", "0"],
    ["--lr", "-1"], ["--eval-interval", "0"], ["--hidden-dropout", "1.0"],
    ["--adam-beta2", "-0.1"], ["--clip-grad", "-1"]])
def test_out_of_range_values(flags):
    assert_names(error_of(*flags), f"{flags[0]} {flags[1]}", "out of range")


def test_zero_stage_2_with_pipeline_parallel():
    message = error_of("--zero-stage", "2", "--pipeline-model-parallel-size", "2", world_size=2)
    assert_names(message, "--zero-stage 2", "--pipeline-model-parallel-size 2", "0 and 1")


def test_zero_stage_3_with_pipeline_engine_needs_no_pipeline_parallel():
    assert_names(error_of("--zero-stage", "3"), "--zero-stage 3", "--no-pipeline-parallel")
    args = validated("--zero-stage", "3", "--no-pipeline-parallel")
    assert args.ds_pipeline_enabled is False


def test_cpu_optimizer_needs_zero():
    assert_names(error_of("--cpu-optimizer", "--zero-stage", "0"), "--cpu-optimizer",
                 "--zero-stage is 0")


@pytest.mark.parametrize("flags, world_size, stage, note", [
    ([], 1, 0, "ZeRO stage 0: one data-parallel rank, over which ZeRO 1 would partition nothing"),
    (["--tensor-model-parallel-size", "2"], 2, 0, "ZeRO stage 0: one data-parallel rank"),
    ([], 2, 1, None),  # Megatron-DeepSpeed's default wherever ZeRO 1 partitions something
    (["--cpu-optimizer"], 1, 1, "ZeRO stage 1 with one data-parallel rank: --cpu-optimizer offloads"),
    (["--sequence-parallel", "--bf16", "--tensor-model-parallel-size", "2"], 2, 1,
     "ZeRO stage 1 with one data-parallel rank: --sequence-parallel with --bf16 on the pipeline engine"),
    (["--sequence-parallel", "--bf16", "--tensor-model-parallel-size", "2", "--no-pipeline-parallel"], 2, 0,
     "ZeRO stage 0"),
    (["--zero-stage", "1"], 1, 1, None),
    (["--ds-sequence-parallel-size", "2", "--no-pipeline-parallel"], 2, 1, None),  # ZeRO splits over the SP ranks
], ids=["dp1", "tp2-dp1", "dp2", "cpu-optimizer", "bf16-sp-pipeline", "bf16-sp-plain", "chosen", "ulysses-sp2-dp1"])
def test_the_default_zero_stage_follows_the_data_parallel_size_and_says_why(flags, world_size, stage, note):
    args = validated(*flags, world_size=world_size)
    assert (args.zero_stage, args.zero_stage_chosen) == (stage, "--zero-stage" in flags)
    assert args.zero_stage_note == note or args.zero_stage_note.startswith(note)
    assert job_config(args).parallel.zero_stage_note == args.zero_stage_note


def test_the_deepspeed_jsons_zero_stage_is_a_choice(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 1}}')
    args = validated("--deepspeed_config", str(path))
    assert (args.zero_stage, args.zero_stage_chosen, args.zero_stage_note) == (1, True, None)


@pytest.mark.parametrize("dropped", ["--num-layers", "--hidden-size", "--num-attention-heads",
                                     "--seq-length", "--micro-batch-size", "--lr"])
def test_required_model_fields(dropped):
    assert_names(error_of(drop=(dropped,)), f"{dropped} is required", "--model-size")


def test_initial_loss_scale_must_be_power_of_two():
    message = error_of("--initial-loss-scale", "1000")
    assert_names(message, "--initial-loss-scale 1000.0", "1024.0")


def test_save_needs_save_interval():
    assert_names(error_of("--save", "ckpt"), "--save ckpt", "--save-interval")


def test_skip_train_needs_a_load_directory_and_eval_iters():
    assert_names(error_of("--skip-train"), "--skip-train", "--load DIR")
    assert_names(error_of("--skip-train", "--load", "ckpt", "--eval-iters", "0"), "--skip-train", "--eval-iters 0")
    assert validated("--skip-train", "--load", "ckpt").skip_train


def test_missing_deepspeed_config_file(tmp_path):
    missing = str(tmp_path / "ds.json")
    assert_names(error_of("--deepspeed_config", missing), f"--deepspeed_config {missing}")


def test_unknown_device_needs_explicit_backend():
    assert_names(error_of(device="tpu"), "'tpu'", "--distributed-backend")


# ----------------------------------------------------------------------------- rotary scaling

ROTARY = ("--use-rotary-position-embeddings",)


@pytest.mark.parametrize("flags, expected", [
    (["--use-rope-scaling"], ("llama3", 8.0, 8192, 1.0, 4.0)),  # Megatron-LM's switch and defaults
    (["--rope-scaling-type", "llama3", "--rope-scaling-factor", "32", "--rope-scaling-low-freq-factor", "2",
      "--rope-scaling-high-freq-factor", "6", "--rope-scaling-original-max-position-embeddings", "4096"],
     ("llama3", 32.0, 4096, 2.0, 6.0)),
    (["--rope-scaling-type", "yarn", "--rotary-scaling-factor", "4"], ("yarn", 4.0, 4096, 1.0, 4.0)),
    (["--rope-scaling-type", "linear", "--rope-scaling-factor", "2"], ("linear", 2.0, None, 1.0, 4.0)),
    (["--rotary-seq-len-interpolation-factor", "2"], ("linear", 2.0, None, 1.0, 4.0)),  # Megatron-LM's linear
    ([], (None, None, None, 1.0, 4.0))])
def test_rope_scaling_flags_reach_the_model_config(flags, expected):
    model = job_config(validated(*ROTARY, *flags)).model
    assert (model.rope_scaling_type, model.rope_scaling_factor, model.rope_scaling_original_max_position_embeddings,
            model.rope_scaling_low_freq_factor, model.rope_scaling_high_freq_factor) == expected


def test_yarn_flags_in_megatron_lms_spellings():
    model = job_config(validated(*ROTARY, "--rope-scaling-type", "yarn", "--rope-scaling-factor", "40",
                                 "--yarn-original-max-position-embeddings", "4096", "--yarn-beta-fast", "16",
                                 "--yarn-beta-slow", "2", "--mscale", "0.707", "--mscale-all-dim", "0.707",
                                 "--no-yarn-correction-range-round-to-int")).model
    assert (model.rope_scaling_factor, model.rope_scaling_original_max_position_embeddings, model.yarn_beta_fast,
            model.yarn_beta_slow, model.yarn_mscale, model.yarn_mscale_all_dim, model.yarn_attention_factor,
            model.yarn_correction_range_round_to_int) == (40.0, 4096, 16.0, 2.0, 0.707, 0.707, None, False)


@pytest.mark.parametrize("flags, message", [
    (["--rope-scaling-type", "yarn"], "--rope-scaling-type yarn needs --rope-scaling-factor (how many times longer "
                                      "the context becomes, e.g. 4)"),
    (["--use-rope-scaling", "--rope-scaling-low-freq-factor", "4"],
     "--rope-scaling-high-freq-factor 4.0 must be above --rope-scaling-low-freq-factor 4.0 (Llama 3.1: 4 and 1)"),
    (["--use-rope-scaling", "--rope-scaling-factor", "0"], "--rope-scaling-factor 0.0 is out of range: it must be "
                                                           "greater than 0"),
    (["--rope-scaling-type", "ntk"], "argument --rope-scaling-type: invalid choice: 'ntk'"),
    (["--use-rope-scaling", "--rotary-seq-len-interpolation-factor", "2"],
     "--rotary-seq-len-interpolation-factor 2 is the linear rotary scaling; it cannot go with --rope-scaling-type "
     "llama3 --rope-scaling-factor None: give one of them")])
def test_bad_rope_scaling_flags_are_one_line_errors(flags, message):
    assert_names(error_of(*ROTARY, *flags), message)


def test_rope_scaling_needs_rotary_position_embeddings():
    assert error_of("--use-rope-scaling") == ("--rope-scaling-type llama3 scales rotary position embeddings; add "
                                              "--use-rotary-position-embeddings or drop it")

@pytest.mark.parametrize("model", [
    ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=64, ffn_hidden_size=48,
                normalization="rmsnorm", add_position_embedding=False, use_rotary_position_embeddings=True,
                rope_theta=500000, swiglu=True, num_key_value_heads=2, add_bias_linear=False,
                untie_embeddings_and_output_weights=True, layernorm_epsilon=1e-6),
    ModelConfig(num_layers=3, hidden_size=64, num_attention_heads=8, max_position_embeddings=128, openai_gelu=True),
])
def test_model_flag_argv_gives_the_model_back(model):
    """The flags a run on a checkpoint must repeat, written from its ModelConfig, parse back to the same
    architecture (launch_finetune.py passes them for an imported model)."""
    values = vars(validated(*model_flag_argv(model), drop=("--num-layers", "--hidden-size", "--num-attention-heads",
                                                           "--max-position-embeddings")))
    back = ModelConfig.from_flags(values)
    assert {name: getattr(back, name) for name in ARCHITECTURE_FLAGS} == \
        {name: getattr(model, name) for name in ARCHITECTURE_FLAGS}
