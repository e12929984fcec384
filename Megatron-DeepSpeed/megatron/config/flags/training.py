"""Training flags of Megatron-DeepSpeed beyond the core set: batch-size ramp-up, token budgets, the optimizer
choice, and upstream's DDP switches (DeepSpeed is the data-parallel engine here, so those change nothing)."""
from megatron.errors import InputError

OPTIMIZERS = ("adam", "sgd")


def add_flags(parser) -> None:
    group = parser.add_argument_group("training schedule and optimizer")
    group.add_argument("--rampup-batch-size", nargs="*",
                       help="START INCREMENT SAMPLES: begin with global batch START and grow it by INCREMENT "
                            "in equal sample intervals until SAMPLES samples are consumed, then use "
                            "--global-batch-size. Needs --train-samples.")
    group.add_argument("--train-tokens", type=int,
                       help="Also stop once this many tokens (samples x --seq-length) have been consumed.")
    group.add_argument("--lr-decay-tokens", type=int,
                       help="Decay the learning rate over this many tokens (overrides the iteration/sample "
                            "decay length).")
    group.add_argument("--lr-warmup-tokens", type=int, help="Warm the learning rate up over this many tokens.")
    group.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                       help="adam: AdamW with --adam-beta1/2 and --adam-eps; sgd: SGD with --sgd-momentum.")
    group.add_argument("--sgd-momentum", type=float, default=0.9, help="Momentum of --optimizer sgd.")
    group.add_argument("--cpu_torch_adam", action="store_true",
                       help="Accepted; always so here: --cpu-optimizer steps torch's AdamW on the CPU.")

    ddp = parser.add_argument_group(
        "upstream DDP switches", "Accepted for upstream scripts; DeepSpeed reduces gradients here, so they "
        "change nothing.")
    ddp.add_argument("--DDP-impl", choices=("local", "torch"), default="local")
    ddp.add_argument("--use-contiguous-buffers-in-ddp", action="store_true")
    ddp.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true")
    ddp.add_argument("--no-scatter-gather-tensors-in-pipeline", action="store_false",
                     dest="scatter_gather_tensors_in_pipeline")


def _rampup_values(args) -> tuple[int, int, int]:
    values = args.rampup_batch_size
    if len(values) != 3:
        raise InputError(f"--rampup-batch-size {' '.join(values)}: give three numbers, START INCREMENT SAMPLES, "
                         "e.g. --rampup-batch-size 16 16 5859375")
    try:
        start, increment, samples = (int(value) for value in values)
    except ValueError:
        raise InputError(f"--rampup-batch-size {' '.join(values)}: START INCREMENT SAMPLES must be whole "
                         "numbers") from None
    return start, increment, samples


def _check_rampup(args) -> None:
    if args.rampup_batch_size is None:
        return
    start, increment, samples = _rampup_values(args)
    if args.train_iters or not args.train_samples:
        raise InputError("--rampup-batch-size counts samples; give the training length as --train-samples "
                         "instead of --train-iters (as upstream requires)")
    step, target = args.micro_batch_size * args.data_parallel_size, args.global_batch_size
    if start <= 0 or increment <= 0 or samples < 0:
        raise InputError(f"--rampup-batch-size {start} {increment} {samples}: START and INCREMENT must be "
                         "positive and SAMPLES at least 0")
    if start > target or (target - start) % increment:
        raise InputError(f"--rampup-batch-size {start} {increment} {samples} must reach --global-batch-size "
                         f"{target} in whole increments: {target} - {start} must be a non-negative multiple "
                         f"of {increment}")
    for name, value in (("START", start), ("INCREMENT", increment)):
        if value % step:
            raise InputError(f"--rampup-batch-size {name} {value} is not a multiple of --micro-batch-size "
                             f"{args.micro_batch_size} x data parallel size {args.data_parallel_size} = {step}")
    args.rampup_batch_size = [start, increment, samples]


def _check_tokens(args) -> None:
    for dest in ("train_tokens", "lr_decay_tokens", "lr_warmup_tokens"):
        value = getattr(args, dest)
        if value is not None and value < 0:
            raise InputError(f"--{dest.replace('_', '-')} {value} must be 0 or more")
    if args.lr_decay_tokens is not None and args.lr_decay_tokens <= (args.lr_warmup_tokens or 0):
        raise InputError(f"--lr-decay-tokens {args.lr_decay_tokens} must be longer than --lr-warmup-tokens "
                         f"{args.lr_warmup_tokens or 0}: the decay starts where the warmup ends")


def validate(args) -> None:
    _check_rampup(args)
    if args.rampup_batch_size is not None and args.sequence_parallel and args.tensor_model_parallel_size > 1:
        raise InputError("--rampup-batch-size with --sequence-parallel is not supported yet: the sequence-parallel "
                         "gradient sum counts a fixed number of micro-batches per step; drop one of them")
    _check_tokens(args)
    if not 0 <= args.sgd_momentum < 1:
        raise InputError(f"--sgd-momentum {args.sgd_momentum} is out of range: it must be in [0, 1)")
