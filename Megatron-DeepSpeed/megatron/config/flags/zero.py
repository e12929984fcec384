"""ZeRO flags of Megatron-DeepSpeed beyond --zero-stage; they become keys of the generated DeepSpeed config
(megatron/config/ds_config.py). Upstream declares them without using them (its DeepSpeed JSON decides); here a flag
that is given sets its key, and a JSON that says otherwise is an error, like every other flag."""
from megatron.errors import InputError
from megatron.files.user_json import read_json_object

REMOTE_DEVICES = ("none", "cpu", "nvme")


def add_flags(parser) -> None:
    group = parser.add_argument_group("ZeRO")
    group.add_argument("--zero-reduce-scatter", action="store_true",
                       help="zero_optimization.reduce_scatter: average gradients with reduce-scatter.")
    group.add_argument("--zero-contigious-gradients", action="store_true",
                       help="zero_optimization.contiguous_gradients: copy gradients into one buffer as they "
                            "are produced. Upstream's spelling.")
    group.add_argument("--zero-reduce-bucket-size", type=int, default=0,
                       help="zero_optimization.reduce_bucket_size in elements (0: DeepSpeed's default).")
    group.add_argument("--zero-allgather-bucket-size", type=int, default=0,
                       help="zero_optimization.allgather_bucket_size in elements (0: DeepSpeed's default).")
    group.add_argument("--remote-device", choices=REMOTE_DEVICES, default="none",
                       help="ZeRO-3: keep the partitioned parameters on this device "
                            "(zero_optimization.offload_param.device; nvme needs a JSON with its nvme_path).")
    group.add_argument("--use-pin-memory", action="store_true",
                       help="ZeRO-3 with --remote-device cpu: pin that memory (offload_param.pin_memory).")


def resolve_zero_stage(args) -> None:
    """--zero-stage when given; else the user's JSON's stage (upstream's scripts often set it only there); else
    1, upstream's default."""
    if args.zero_stage is not None:
        return
    stage = None
    if args.deepspeed_config:
        path = args.deepspeed_config
        zero = read_json_object(path, f"--deepspeed_config {path}", "fix the file or drop the flag").get(
            "zero_optimization")
        stage = zero.get("stage") if isinstance(zero, dict) else None
        if stage not in (None, 0, 1, 2, 3):
            raise InputError(f"--deepspeed_config {path} sets zero_optimization.stage={stage!r}; use 0, 1, 2 or 3")
    args.zero_stage = 1 if stage is None else stage


def validate(args) -> None:
    for dest in ("zero_reduce_bucket_size", "zero_allgather_bucket_size"):
        if getattr(args, dest) < 0:
            raise InputError(f"--{dest.replace('_', '-')} {getattr(args, dest)} must be 0 (DeepSpeed's default) "
                             "or a positive number of elements")
    if args.remote_device != "none" and args.zero_stage != 3:
        raise InputError(f"--remote-device {args.remote_device} places ZeRO-3's partitioned parameters, but "
                         f"--zero-stage is {args.zero_stage}; use --zero-stage 3 or drop it")
    if args.use_pin_memory and args.remote_device != "cpu":
        raise InputError("--use-pin-memory pins the CPU memory of --remote-device cpu; add --remote-device cpu "
                         "or drop it")
