"""Activation-checkpointing flags: which layers are recomputed, and DeepSpeed's checkpointing options."""
from megatron.errors import InputError


def add_flags(parser) -> None:
    group = parser.add_argument_group(
        "activation checkpointing", "--checkpoint-activations turns recomputation on; these choose how.")
    group.add_argument("--checkpoint-num-layers", type=int, default=1,
                       help="Transformer layers per recomputed chunk.")
    group.add_argument("--distribute-checkpointed-activations", action="store_true",
                       help="Split the saved chunk inputs over the tensor-parallel group (DeepSpeed's "
                            "partition_activations; implies --deepspeed-activation-checkpointing).")
    group.add_argument("--deepspeed-activation-checkpointing", action="store_true",
                       help="Recompute with deepspeed.checkpointing (configured by the flags below) instead "
                            "of torch.utils.checkpoint.")
    group.add_argument("--partition-activations", action="store_true",
                       help="DeepSpeed: split saved activations over the tensor-parallel group.")
    group.add_argument("--contigious-checkpointing", action="store_true",
                       help="DeepSpeed: keep partitioned checkpoints in one contiguous buffer (needs "
                            "--partition-activations). Upstream's spelling.")
    group.add_argument("--checkpoint-in-cpu", action="store_true",
                       help="DeepSpeed: keep the saved activations in CPU memory.")
    group.add_argument("--synchronize-each-layer", action="store_true",
                       help="DeepSpeed: synchronise the device before and after each checkpointed chunk.")
    group.add_argument("--profile-backward", action="store_true",
                       help="DeepSpeed: log forward/backward times of each checkpointed chunk.")


def validate(args) -> None:
    if args.checkpoint_num_layers < 1:
        raise InputError(f"--checkpoint-num-layers {args.checkpoint_num_layers} must be 1 or more")
    if args.distribute_checkpointed_activations:
        if not args.checkpoint_activations:
            raise InputError("--distribute-checkpointed-activations splits the activations that "
                             "--checkpoint-activations saves; add --checkpoint-activations")
        args.deepspeed_activation_checkpointing = True
        args.partition_activations = True
    if args.contigious_checkpointing and not args.partition_activations:
        raise InputError("--contigious-checkpointing packs partitioned activations; add "
                         "--partition-activations (DeepSpeed supports it only with partitioning)")
