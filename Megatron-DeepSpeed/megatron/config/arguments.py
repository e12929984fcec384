"""Command-line flags with Megatron-DeepSpeed's names and meanings, and their validation.

`parse_args` knows only the command line (plus a --model-size preset). `validate_args` adds what
needs the world size and the device (data parallel size, batch defaults, backend) and turns every
inconsistency into an InputError that names the flags, their values and the fix, before any
process group or model exists.
"""
import argparse
import logging
import math
import os
from types import MappingProxyType

from megatron.config import flags
from megatron.config.learning_rates import DECAY_STYLES
from megatron.config.presets import get_preset, preset_names
from megatron.errors import InputError, require_divisible
from megatron.tokenizer import SENTENCEPIECE_TYPES, TOKENIZER_TYPES

DISTRIBUTED_BACKENDS = ("nccl", "hccl", "gloo", "ccl")
BACKEND_BY_DEVICE = MappingProxyType(
    {"cuda": "nccl", "npu": "hccl", "hpu": "hccl", "xpu": "ccl", "cpu": "gloo"})
DEVICES_WITHOUT_FP16 = frozenset({"cpu"})

# Flags a --model-size preset may fill have argparse default None, so "not given" stays visible
# and an explicit flag always wins. These are their defaults when neither set them.
_DEFAULTS_AFTER_PRESET = MappingProxyType({
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "min_lr": 0.0,
    "lr_decay_style": "linear",
    "hidden_dropout": 0.1,
    "attention_dropout": 0.1,
    "checkpoint_activations": False,
    "no_pipeline_parallel": False,
    "seed": 1234,
    "split": "969, 30, 1",
})

# A preset value is skipped when the user chose one of its alternatives (they exclude each other).
_PRESET_ALTERNATIVES = MappingProxyType({
    "train_iters": ("train_samples",),
    "lr_decay_iters": ("lr_decay_samples", "train_samples"),
    "lr_warmup_fraction": ("lr_warmup_iters", "lr_warmup_samples"),
})

_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
             "micro_batch_size", "lr")
_POSITIVE = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
             "max_position_embeddings", "micro_batch_size", "global_batch_size", "train_iters",
             "train_samples", "lr_decay_iters", "lr_decay_samples", "tensor_model_parallel_size",
             "pipeline_model_parallel_size", "make_vocab_size_divisible_by", "vocab_size",
             "save_interval", "eval_interval", "log_interval", "exit_interval", "loss_scale",
             "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis",
             "adam_eps")
_NON_NEGATIVE = ("lr", "min_lr", "weight_decay", "clip_grad", "init_method_std", "eval_iters",
                 "num_workers", "lr_warmup_iters", "lr_warmup_samples", "lr_warmup_fraction")
_FRACTIONS_BELOW_ONE = ("hidden_dropout", "attention_dropout", "adam_beta1", "adam_beta2")

_log = logging.getLogger(__name__)


def _flag(dest):
    """The command-line spelling of an argparse attribute, for messages."""
    return "--" + dest.replace("_", "-")


def _after_preset(dest):
    return f"Default {_DEFAULTS_AFTER_PRESET[dest]!r}; --model-size may set it."


# ----------------------------------------------------------------------------- flags

def _add_model_args(parser):
    group = parser.add_argument_group("model")
    group.add_argument("--model-size", choices=preset_names(), default=None,
                       help="Fill every model/batch/LR/parallel flag not given explicitly from "
                            "this preset (megatron/config/presets.py).")
    group.add_argument("--num-layers", type=int, help="Number of transformer layers.")
    group.add_argument("--hidden-size", type=int, help="Transformer hidden size.")
    group.add_argument("--num-attention-heads", type=int, help="Attention heads per layer.")
    group.add_argument("--seq-length", type=int, help="Tokens per sample.")
    group.add_argument("--ffn-hidden-size", type=int,
                       help="MLP inner size. Default 4 x --hidden-size.")
    group.add_argument("--max-position-embeddings", type=int,
                       help="Size of the position embedding table. Default --seq-length.")
    group.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                       help="Pad the vocab to a multiple of this x tensor parallel size.")
    group.add_argument("--init-method-std", type=float, default=0.02,
                       help="Std of the normal weight init.")
    group.add_argument("--hidden-dropout", type=float,
                       help="Dropout after attention and MLP. " + _after_preset("hidden_dropout"))
    group.add_argument("--attention-dropout", type=float,
                       help="Dropout on attention probabilities. "
                            + _after_preset("attention_dropout"))
    group.add_argument("--openai-gelu", action="store_true",
                       help="Use the tanh approximation of GeLU instead of the erf form.")


def _add_training_args(parser):
    group = parser.add_argument_group("training")
    group.add_argument("--micro-batch-size", type=int, help="Samples per device per step.")
    group.add_argument("--global-batch-size", type=int,
                       help="Samples per optimizer step over all data parallel ranks. "
                            "Default micro batch x data parallel size.")
    group.add_argument("--train-iters", type=int, help="Iterations to train (or --train-samples).")
    group.add_argument("--train-samples", type=int, help="Samples to train (or --train-iters).")
    group.add_argument("--checkpoint-activations", action=argparse.BooleanOptionalAction,
                       help="Recompute each layer's activations in backward. "
                            + _after_preset("checkpoint_activations"))
    group.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay.")
    group.add_argument("--clip-grad", type=float, default=1.0,
                       help="Clip the global gradient norm to this (0 = no clipping).")
    group.add_argument("--adam-beta1", type=float, default=0.9)
    group.add_argument("--adam-beta2", type=float, default=0.999)
    group.add_argument("--adam-eps", type=float, default=1e-8)
    group.add_argument("--cpu-optimizer", action="store_true",
                       help="Keep optimizer state on the CPU (DeepSpeed ZeRO offload_optimizer).")
    group.add_argument("--seed", type=int, help="Random seed. " + _after_preset("seed"))
    group.add_argument("--exit-interval", type=int,
                       help="Stop after the iteration that is a multiple of this.")


def _add_learning_rate_args(parser):
    group = parser.add_argument_group("learning rate")
    group.add_argument("--lr", type=float, help="Peak learning rate.")
    group.add_argument("--min-lr", type=float,
                       help="Learning rate floor of the decay. " + _after_preset("min_lr"))
    group.add_argument("--lr-decay-style", choices=DECAY_STYLES,
                       help=_after_preset("lr_decay_style"))
    group.add_argument("--lr-decay-iters", type=int,
                       help="Iterations to decay over. Default --train-iters.")
    group.add_argument("--lr-decay-samples", type=int,
                       help="Samples to decay over. Default --train-samples.")
    group.add_argument("--lr-warmup-fraction", type=float,
                       help="Warmup as a fraction of the decay length.")
    group.add_argument("--lr-warmup-iters", type=int, help="Warmup length in iterations.")
    group.add_argument("--lr-warmup-samples", type=int, help="Warmup length in samples.")


def _add_mixed_precision_args(parser):
    group = parser.add_argument_group("mixed precision")
    group.add_argument("--fp16", action="store_true", help="Train in fp16 with loss scaling.")
    group.add_argument("--bf16", action="store_true", help="Train in bfloat16.")
    group.add_argument("--loss-scale", type=float,
                       help="Static fp16 loss scale. Default: dynamic loss scaling.")
    group.add_argument("--initial-loss-scale", type=float, default=2.0 ** 32,
                       help="First dynamic loss scale (a power of two).")
    group.add_argument("--min-loss-scale", type=float, default=1.0,
                       help="Dynamic loss scale never goes below this.")
    group.add_argument("--loss-scale-window", type=int, default=1000,
                       help="Overflow-free steps before the dynamic loss scale grows.")
    group.add_argument("--hysteresis", type=int, default=2,
                       help="Overflows tolerated before the dynamic loss scale shrinks.")


def _add_data_args(parser):
    group = parser.add_argument_group("data and tokenizer")
    group.add_argument("--data-path", nargs="*",
                       help="One .bin/.idx prefix, or pairs: weight1 prefix1 weight2 prefix2 ...")
    group.add_argument("--split", help="Train,valid,test proportions. " + _after_preset("split"))
    group.add_argument("--mock-data", action="store_true",
                       help="Train on synthetic tokens; no data files.")
    group.add_argument("--data-cache-path", help="Where to keep the sample index cache.")
    group.add_argument("--num-workers", type=int, default=2, help="Data loader workers.")
    group.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default="GPT2BPETokenizer")
    group.add_argument("--vocab-file", help="GPT-2 vocab.json.")
    group.add_argument("--merge-file", help="GPT-2 merges.txt.")
    group.add_argument("--tokenizer-model", help="SentencePiece model file.")
    group.add_argument("--vocab-size", type=int, help="Vocabulary size for NullTokenizer.")
    group.add_argument("--eod-mask-loss", action="store_true",
                       help="Do not train on predicting end-of-document tokens.")
    group.add_argument("--reset-position-ids", action="store_true",
                       help="Restart position ids after each end-of-document token.")
    group.add_argument("--reset-attention-mask", action="store_true",
                       help="Do not attend across end-of-document tokens.")


def _add_checkpoint_and_logging_args(parser):
    group = parser.add_argument_group("checkpoints, evaluation and logging")
    group.add_argument("--save", help="Directory to save checkpoints to.")
    group.add_argument("--load", help="Directory to resume from (a checkpoint at this run's layout, or one "
                                      "reshaped by tools/convert_checkpoint.py).")
    group.add_argument("--finetune", action="store_true",
                       help="Load only the weights from --load: iteration, optimizer, LR schedule and random "
                            "state start fresh.")
    group.add_argument("--no-load-optim", action="store_true",
                       help="Do not load the optimizer state from --load (it starts fresh).")
    group.add_argument("--no-load-rng", action="store_true",
                       help="Do not load the random generators' states from --load.")
    group.add_argument("--no-save-optim", action="store_true",
                       help="Save checkpoints without the optimizer state (a resume then starts it fresh).")
    group.add_argument("--override-lr-scheduler", action="store_true",
                       help="Use this command line's learning-rate schedule flags even if --load's differ.")
    group.add_argument("--use-checkpoint-lr-scheduler", action="store_true",
                       help="Continue --load's learning-rate schedule, ignoring this command line's.")
    group.add_argument("--save-interval", type=int, help="Iterations between checkpoints.")
    group.add_argument("--eval-interval", type=int, default=1000,
                       help="Iterations between validation runs.")
    group.add_argument("--eval-iters", type=int, default=100,
                       help="Batches per validation run (0 = no validation).")
    group.add_argument("--log-interval", type=int, default=100,
                       help="Iterations between log lines.")
    group.add_argument("--tensorboard-dir", help="Write TensorBoard events here.")
    group.add_argument("--skip-train", action="store_true",
                       help="Do not train: evaluate the checkpoint in --load on the validation and test "
                            "splits (--eval-iters batches of each) and exit.")


def _add_distributed_args(parser):
    group = parser.add_argument_group("parallelism and DeepSpeed")
    group.add_argument("--tensor-model-parallel-size", type=int,
                       help=_after_preset("tensor_model_parallel_size"))
    group.add_argument("--pipeline-model-parallel-size", type=int,
                       help=_after_preset("pipeline_model_parallel_size"))
    group.add_argument("--sequence-parallel", action="store_true",
                       help="Split LayerNorm/dropout activations along the sequence over TP.")
    group.add_argument("--no-pipeline-parallel", action="store_true", default=None,
                       help="Use DeepSpeed's plain engine instead of its pipeline engine "
                            "(needs --pipeline-model-parallel-size 1).")
    group.add_argument("--distributed-backend", choices=DISTRIBUTED_BACKENDS,
                       help="Default: chosen by the device (nccl, hccl or gloo).")
    group.add_argument("--deepspeed", "--deepscale", action="store_true",
                       help="Accepted; training always runs on DeepSpeed.")
    group.add_argument("--deepspeed_config", "--deepscale_config",
                       help="DeepSpeed JSON; default: generated from these flags.")
    group.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3),
                       help="ZeRO stage. Default: the --deepspeed_config JSON's zero_optimization.stage, "
                            "else 1 (Megatron-DeepSpeed's default).")
    group.add_argument("--local_rank", "--local-rank", type=int,
                       help="Passed by the deepspeed launcher: becomes LOCAL_RANK when the environment has "
                            "none, and must agree with it otherwise.")


class _OneLineErrorParser(argparse.ArgumentParser):
    """A malformed command line is an InputError (one line, exit 2 through run_cli), not a usage dump."""

    def error(self, message):
        raise InputError(f"{message} (see {self.prog} --help)")


def _number_above(minimum, kind):
    """argparse type: a `kind` number greater than `minimum`."""
    def parse(text):
        value = kind(text)
        if not value > minimum:
            raise argparse.ArgumentTypeError(f"{text} must be greater than {minimum}")
        return value
    return parse


def _add_stopping_args(parser):
    group = parser.add_argument_group("stopping early and hangs")
    group.add_argument("--max-consecutive-nan-iterations", type=_number_above(0, int), default=10,
                       help="Stop a diverged run (exit 1) after this many iterations in a row whose loss or "
                            "gradient norm is not finite; their updates are skipped.")
    group.add_argument("--exit-signal-handler", action="store_true",
                       help="On SIGTERM (or SIGINT), save a checkpoint after the current iteration and exit 0.")
    group.add_argument("--exit-duration-in-mins", type=_number_above(0, float),
                       help="Save a checkpoint and exit 0 once the run has lasted this many minutes.")
    group.add_argument("--distributed-timeout-minutes", type=_number_above(0, float), default=10.0,
                       help="A collective that waits longer than this for a peer rank ends the run.")


def _build_parser():
    parser = _OneLineErrorParser(description="GPT pre-training (Megatron-DeepSpeed flags)",
                                 allow_abbrev=False)
    for add_group in (_add_model_args, _add_training_args, _add_learning_rate_args,
                      _add_mixed_precision_args, _add_data_args,
                      _add_checkpoint_and_logging_args, _add_distributed_args, _add_stopping_args,
                      flags.add_flags):
        add_group(parser)
    return parser


def _apply_preset(args):
    """Fill from --model-size whatever the user did not give (directly or via an alternative)."""
    if args.model_size is None:
        return
    for dest, value in get_preset(args.model_size).items():
        alternatives = _PRESET_ALTERNATIVES.get(dest, ())
        chosen = [getattr(args, name) for name in (dest, *alternatives)]
        if all(given is None for given in chosen):
            setattr(args, dest, value)


def parse_args(argv=None, extra_args_provider=None):
    """Parse flags (sys.argv[1:] when argv is None); `extra_args_provider(parser) -> parser` may
    add a script's own flags. World-size-dependent values are left to validate_args."""
    parser = _build_parser()
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    args = parser.parse_args(argv)
    flags.after_parse(args)
    _apply_preset(args)
    for dest, value in _DEFAULTS_AFTER_PRESET.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    flags.reject_unsupported(args)
    return args


# ----------------------------------------------------------------------------- validation

def _check_required(args):
    for dest in _REQUIRED:
        if getattr(args, dest) is None:
            raise InputError(f"{_flag(dest)} is required: give it, or --model-size NAME "
                             f"(one of {', '.join(preset_names())}) to take it from a preset")


def _check_ranges(args):
    for names, ok, wanted in ((_POSITIVE, lambda v: v > 0, "greater than 0"),
                              (_NON_NEGATIVE, lambda v: v >= 0, "0 or more"),
                              (_FRACTIONS_BELOW_ONE, lambda v: 0 <= v < 1, "in [0, 1)")):
        for dest in names:
            value = getattr(args, dest)
            if value is not None and not ok(value):
                raise InputError(f"{_flag(dest)} {value} is out of range: it must be {wanted}")


def _set_parallel_sizes(args, world_size):
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if world_size < 1:
        raise InputError(f"world size {world_size} must be at least 1; check the launcher "
                         f"(WORLD_SIZE)")
    if world_size < tp * pp:
        raise InputError(
            f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} needs at least "
            f"{tp * pp} processes (one per device), but world size is {world_size}; launch {tp * pp} "
            f"or a multiple (e.g. torchrun --nproc_per_node {tp * pp}), or lower those sizes")
    require_divisible("world size", world_size,
                      f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} =", tp * pp,
                      f"launch a multiple of {tp * pp} processes or lower those sizes")
    args.world_size = world_size
    args.data_parallel_size = world_size // (tp * pp)


def _set_model_shape(args):
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    tp = args.tensor_model_parallel_size
    if args.seq_length > args.max_position_embeddings:
        raise InputError(
            f"--seq-length {args.seq_length} is above --max-position-embeddings "
            f"{args.max_position_embeddings}; raise --max-position-embeddings to at least "
            f"{args.seq_length} or shorten --seq-length")
    require_divisible("--hidden-size", args.hidden_size, "--num-attention-heads", args.num_attention_heads,
                      "pick a hidden size that is a multiple of the head count")
    for dest in ("num_attention_heads", "ffn_hidden_size"):
        require_divisible(_flag(dest), getattr(args, dest), "--tensor-model-parallel-size", tp,
                          f"tensor parallelism splits it evenly, so choose a multiple of {tp} or a smaller "
                          f"tensor parallel size")


def _set_batch_sizes(args):
    micro, dp = args.micro_batch_size, args.data_parallel_size
    step = micro * dp
    if args.global_batch_size is None:
        args.global_batch_size = step
    if args.global_batch_size % step:
        nearby = sorted({max(step, args.global_batch_size // step * step),
                         (args.global_batch_size // step + 1) * step})
        raise InputError(
            f"--global-batch-size {args.global_batch_size} is not divisible by "
            f"--micro-batch-size {micro} x data parallel size {dp} (world size {args.world_size} "
            f"/ (TP {args.tensor_model_parallel_size} x PP {args.pipeline_model_parallel_size}))"
            f" = {step}; use a multiple of {step}, e.g. {' or '.join(map(str, nearby))}")
    args.num_micro_batches = args.global_batch_size // step


def _set_precision(args, device_name):
    if args.fp16 and args.bf16:
        raise InputError("--fp16 and --bf16 were both given; choose one (or neither for fp32)")
    if args.fp16 and device_name in DEVICES_WITHOUT_FP16:
        raise InputError(f"--fp16 is not supported on device '{device_name}'; use --bf16, or "
                         f"leave both --fp16 and --bf16 off to train in fp32")
    if not math.log2(args.initial_loss_scale).is_integer():
        raise InputError(f"--initial-loss-scale {args.initial_loss_scale} is not a power of two "
                         f"(DeepSpeed takes its log2); use e.g. "
                         f"{2.0 ** round(math.log2(args.initial_loss_scale))}")


def _given(args, *dests):
    """The flags among dests that were set; 0 counts as unset, like Megatron's warmup defaults."""
    return [dest for dest in dests if getattr(args, dest) not in (None, 0)]


def _describe(args, dests):
    return " and ".join(f"{_flag(dest)} {getattr(args, dest)}" for dest in dests)


def _check_training_length(args):
    length = _given(args, "train_iters", "train_samples")
    if len(length) != 1:
        got = f"both {_describe(args, length)} were given" if length else "neither was given"
        raise InputError(f"give exactly one of --train-iters or --train-samples; {got}")
    warmups = _given(args, "lr_warmup_fraction", "lr_warmup_iters", "lr_warmup_samples")
    if len(warmups) > 1:
        raise InputError(f"give at most one LR warmup, but {_describe(args, warmups)} were given")
    unit, other = ("iters", "samples") if args.train_iters is not None else ("samples", "iters")
    mismatched = _given(args, f"lr_decay_{other}", f"lr_warmup_{other}")
    if mismatched:
        raise InputError(
            f"{_describe(args, mismatched)} counts {other}, but training length is "
            f"{_describe(args, length)}; use --lr-decay-{unit} / --lr-warmup-{unit} instead")
    decay_dest = f"lr_decay_{unit}"
    if getattr(args, decay_dest) is None:
        setattr(args, decay_dest, getattr(args, f"train_{unit}"))
    decay = getattr(args, decay_dest)
    if args.lr_warmup_fraction is not None and args.lr_warmup_fraction > 1:
        raise InputError(f"--lr-warmup-fraction {args.lr_warmup_fraction} makes the warmup "
                         f"longer than the LR decay; use a fraction between 0 and 1")
    warmup = getattr(args, f"lr_warmup_{unit}")
    if warmup is not None and warmup > decay:
        raise InputError(
            f"--lr-warmup-{unit} {warmup} is longer than the LR decay ({_flag(decay_dest)} {decay}"
            f", which defaults to --train-{unit}); shorten the warmup or lengthen the decay")
    args.lr_warmup_iters = args.lr_warmup_iters or 0
    args.lr_warmup_samples = args.lr_warmup_samples or 0


def _check_learning_rate(args):
    if args.lr < args.min_lr:
        raise InputError(f"--lr {args.lr} is below --min-lr {args.min_lr}; the peak learning "
                         f"rate must be at least the floor")


def _check_data(args):
    if args.mock_data and args.data_path:
        raise InputError(f"--mock-data and --data-path {' '.join(args.data_path)} were both "
                         f"given; drop one (--mock-data trains on synthetic tokens)")
    if not args.mock_data:
        _check_data_path(args.data_path)
    _check_split(args.split)


def _check_data_path(data_path):
    if not data_path:
        raise InputError("--data-path is required: give a .bin/.idx prefix or 'weight prefix' "
                         "pairs, or pass --mock-data to train on synthetic tokens")
    if len(data_path) == 1:
        return
    if len(data_path) % 2:
        raise InputError(f"--data-path {' '.join(data_path)}: with several datasets give "
                         f"'weight prefix' pairs, but there are {len(data_path)} values")
    for weight in data_path[0::2]:
        try:
            ok = float(weight) > 0
        except ValueError:
            ok = False
        if not ok:
            raise InputError(f"--data-path weight {weight!r} is not a positive number; "
                             f"write pairs like '--data-path 0.3 prefixA 0.7 prefixB'")


def _check_split(split):
    parts = split.replace("/", ",").split(",")
    try:
        weights = [float(part) for part in parts]
    except ValueError:
        weights = []
    if not weights or len(weights) > 3 or min(weights) < 0 or sum(weights) <= 0:
        raise InputError(f"--split {split!r} must be up to three non-negative numbers "
                         f"(train,valid,test) with a positive sum, e.g. '949,50,1'")


def _check_file(args, dest, what):
    value = getattr(args, dest)
    if value is None:
        raise InputError(f"--tokenizer-type {args.tokenizer_type} needs {_flag(dest)}; give the "
                         f"path of {what}")
    if not os.path.isfile(value):
        raise InputError(f"{_flag(dest)} {value} does not exist; give the path of {what}")


def _check_tokenizer(args):
    if args.tokenizer_type == "GPT2BPETokenizer":
        _check_file(args, "vocab_file", "GPT-2's vocab.json")
        _check_file(args, "merge_file", "GPT-2's merges.txt")
    elif args.tokenizer_type in SENTENCEPIECE_TYPES:
        _check_file(args, "tokenizer_model", "a SentencePiece .model file")
    elif args.vocab_size is None:
        raise InputError("--tokenizer-type NullTokenizer needs --vocab-size N")


def _check_parallel_features(args):
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if args.sequence_parallel and tp == 1:
        _log.warning("--sequence-parallel has no effect with --tensor-model-parallel-size 1; "
                     "turning it off")
        args.sequence_parallel = False
    if args.sequence_parallel and args.seq_length % tp:
        raise InputError(f"--sequence-parallel splits --seq-length {args.seq_length} over "
                         f"--tensor-model-parallel-size {tp}, which does not divide it; use a "
                         f"multiple of {tp}")
    if pp > args.num_layers:
        raise InputError(f"--pipeline-model-parallel-size {pp} is more than --num-layers "
                         f"{args.num_layers}: every pipeline stage needs a transformer layer; use at most "
                         f"{args.num_layers} stages or more layers (uneven splits are fine: stages are cut "
                         f"between layers as evenly as possible)")
    if args.no_pipeline_parallel and pp > 1:
        raise InputError(f"--no-pipeline-parallel contradicts --pipeline-model-parallel-size "
                         f"{pp}; drop one of them")
    args.ds_pipeline_enabled = not args.no_pipeline_parallel
    if args.zero_stage >= 2 and args.ds_pipeline_enabled:
        fix = ("use --zero-stage 0 or 1" if pp > 1 else
               "use --zero-stage 0 or 1, or add --no-pipeline-parallel")
        raise InputError(f"--zero-stage {args.zero_stage} with --pipeline-model-parallel-size "
                         f"{pp}: DeepSpeed's pipeline engine supports only ZeRO stages 0 and 1; "
                         f"{fix}")
    _check_sequence_parallel_gradients(args)
    if args.cpu_optimizer and args.zero_stage == 0:
        raise InputError("--cpu-optimizer offloads ZeRO optimizer state, but --zero-stage is 0; "
                         "use --zero-stage 1, 2 or 3")


def _check_sequence_parallel_gradients(args):
    """Sequence-parallel gradients are summed over the tensor-parallel ranks once per step, from the gradients
    accumulated on the parameters (megatron/tensor_parallel/sequence_parallel_grads.py); refuse the DeepSpeed
    modes that take the gradients off the parameters during backward."""
    if not args.sequence_parallel:
        return
    if args.zero_stage >= 2:
        raise InputError(f"--sequence-parallel with --zero-stage {args.zero_stage}: ZeRO stages 2 and 3 "
                         f"partition each gradient during backward, before the sequence-parallel gradients "
                         f"are summed over the tensor-parallel ranks at the end of the step; use --zero-stage "
                         f"0 or 1")
    if args.bf16 and args.zero_stage == 0 and args.ds_pipeline_enabled:
        raise InputError("--sequence-parallel with --bf16 and --zero-stage 0 on the pipeline engine: DeepSpeed's "
                         "bf16 pipeline optimizer moves each micro-batch's gradients into fp32 buffers during "
                         "backward, before the sequence-parallel gradients are summed at the end of the step; "
                         "use --zero-stage 1")


def _set_backend(args, device_name):
    if args.distributed_backend is not None:
        return
    if device_name not in BACKEND_BY_DEVICE:
        raise InputError(f"no default --distributed-backend for device '{device_name}'; pass "
                         f"one of {', '.join(DISTRIBUTED_BACKENDS)}")
    args.distributed_backend = BACKEND_BY_DEVICE[device_name]


def _check_checkpoint_and_config(args):
    if args.save is not None and args.save_interval is None:
        raise InputError(f"--save {args.save} needs --save-interval N (iterations between "
                         f"checkpoints)")
    if args.no_save_optim and args.zero_stage == 3:
        raise InputError("--no-save-optim with --zero-stage 3: ZeRO-3 keeps the weights in its optimizer "
                         "partitions, so they cannot be left out; drop --no-save-optim or use --zero-stage 0-2")
    if args.deepspeed_config is not None and not os.path.isfile(args.deepspeed_config):
        raise InputError(f"--deepspeed_config {args.deepspeed_config} does not exist; give a "
                         f"DeepSpeed JSON file, or drop the flag to generate one from the flags")
    if args.skip_train and not args.load:
        raise InputError("--skip-train evaluates the checkpoint in --load, but --load was not given; add "
                         "--load DIR (the --save directory of a training run)")
    if args.skip_train and not args.eval_iters:
        raise InputError("--skip-train with --eval-iters 0 evaluates nothing; give --eval-iters N (batches of "
                         "each split to evaluate)")


def validate_args(args, world_size, device_name):
    """Check the flags against each other, the world size and the device; fill derived values
    (world_size, data_parallel_size, num_micro_batches, ds_pipeline_enabled, ...).
    Returns args; raises InputError on the first problem."""
    _check_required(args)
    _check_ranges(args)
    _set_parallel_sizes(args, world_size)
    _set_model_shape(args)
    _set_batch_sizes(args)
    flags.validate(args)
    _set_precision(args, device_name)
    _check_training_length(args)
    _check_learning_rate(args)
    _check_data(args)
    _check_tokenizer(args)
    _check_parallel_features(args)
    _set_backend(args, device_name)
    _check_checkpoint_and_config(args)
    return args
