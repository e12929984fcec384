"""Logging and TensorBoard flags of Megatron-DeepSpeed beyond --log-interval and --tensorboard-dir."""
from megatron.errors import InputError


def add_flags(parser) -> None:
    group = parser.add_argument_group("logging and TensorBoard")
    group.add_argument("--log-params-norm", action="store_true",
                       help="Add the L2 norm of the parameters to the log line (' params norm:').")
    group.add_argument("--log-num-zeros-in-grad", action="store_true",
                       help="Add the count of zero gradient entries to the log line (' num zeros:'); needs "
                            "--zero-stage 0 without --fp16/--bf16, where gradients are visible per parameter.")
    group.add_argument("--timing-log-level", type=int, choices=(0, 1, 2), default=0,
                       help="0: iteration time only. 1 and 2 add the forward-backward and optimizer times "
                            "(measured with a device synchronisation, which can slow training).")
    group.add_argument("--tensorboard-log-interval", type=int, default=1,
                       help="Iterations between TensorBoard writes.")
    group.add_argument("--tensorboard-queue-size", type=int, default=1000,
                       help="Events the TensorBoard writer queues before it flushes to disk.")
    group.add_argument("--log-timers-to-tensorboard", action="store_true",
                       help="Write iteration time (and the --timing-log-level timers) to TensorBoard.")
    group.add_argument("--log-batch-size-to-tensorboard", action="store_true",
                       help="Write the global batch size to TensorBoard.")
    group.add_argument("--no-log-learnig-rate-to-tensorboard", "--no-log-learning-rate-to-tensorboard",
                       action="store_false", dest="log_learning_rate_to_tensorboard",
                       help="Do not write the learning rate to TensorBoard (upstream's spelling first).")
    group.add_argument("--no-log-loss-scale-to-tensorboard", action="store_false",
                       dest="log_loss_scale_to_tensorboard", help="Do not write the loss scale to TensorBoard.")
    group.add_argument("--log-validation-ppl-to-tensorboard", action="store_true",
                       help="Write validation perplexity to TensorBoard.")
    group.add_argument("--log-optimizer-states-to-tensorboard", action="store_true",
                       help="Write norms and extremes of Adam's moments and of the weights to TensorBoard.")
    group.add_argument("--log-memory-to-tensorboard", action="store_true",
                       help="Write the device memory in use (the process's resident memory on CPU).")


def validate(args) -> None:
    for dest in ("tensorboard_log_interval", "tensorboard_queue_size"):
        if getattr(args, dest) < 1:
            raise InputError(f"--{dest.replace('_', '-')} {getattr(args, dest)} must be 1 or more")
    if args.log_num_zeros_in_grad and (args.zero_stage != 0 or args.fp16 or args.bf16):
        raise InputError("--log-num-zeros-in-grad counts gradient entries per parameter, which DeepSpeed keeps "
                         "only with --zero-stage 0 in fp32 (ZeRO and --fp16/--bf16 hold them in flat "
                         "partitions); use --zero-stage 0 without --fp16/--bf16, or drop the flag")
    if args.log_optimizer_states_to_tensorboard and args.optimizer != "adam":
        raise InputError("--log-optimizer-states-to-tensorboard reports Adam's moments; it needs --optimizer "
                         "adam")
