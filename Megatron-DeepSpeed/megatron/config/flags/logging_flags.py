"""Logging and evaluation flags: log lines, validation runs (or --skip-train: evaluation only) and TensorBoard;
their checks, and the LoggingConfig section."""
from typing import Mapping

from megatron.config.flags.common import Limits, same_named
from megatron.config.job import LoggingConfig
from megatron.errors import InputError

LIMITS = Limits(positive=("eval_interval", "log_interval"), non_negative=("eval_iters",))


def add_flags(parser) -> None:
    group = parser.add_argument_group("logging and evaluation")
    group.add_argument("--log-interval", type=int, default=100,
                       help="Iterations between log lines.")
    group.add_argument("--eval-interval", type=int, default=1000,
                       help="Iterations between validation runs.")
    group.add_argument("--eval-iters", type=int, default=100,
                       help="Batches per validation run (0 = no validation).")
    group.add_argument("--skip-train", action="store_true",
                       help="Do not train: evaluate the checkpoint in --load on the validation and test "
                            "splits (--eval-iters batches of each) and exit.")
    group.add_argument("--log-params-norm", action="store_true",
                       help="Add the L2 norm of the parameters to the log line (' params norm:').")
    group.add_argument("--log-num-zeros-in-grad", action="store_true",
                       help="Add the count of zero gradient entries to the log line (' num zeros:'); needs "
                            "--zero-stage 0 without --fp16/--bf16, where gradients are visible per parameter.")
    group.add_argument("--timing-log-level", type=int, choices=(0, 1, 2), default=0,
                       help="0: iteration time only. 1 and 2 add the forward-backward and optimizer times "
                            "(measured with a device synchronisation, which can slow training).")
    board = parser.add_argument_group("TensorBoard")
    board.add_argument("--tensorboard-dir", help="Write TensorBoard events here.")
    board.add_argument("--tensorboard-log-interval", type=int, default=1,
                       help="Iterations between TensorBoard writes.")
    board.add_argument("--tensorboard-queue-size", type=int, default=1000,
                       help="Events the TensorBoard writer queues before it flushes to disk.")
    board.add_argument("--log-timers-to-tensorboard", action="store_true",
                       help="Write iteration time (and the --timing-log-level timers) to TensorBoard.")
    board.add_argument("--log-batch-size-to-tensorboard", action="store_true",
                       help="Write the global batch size to TensorBoard.")
    board.add_argument("--no-log-learnig-rate-to-tensorboard", "--no-log-learning-rate-to-tensorboard",
                       action="store_false", dest="log_learning_rate_to_tensorboard",
                       help="Do not write the learning rate to TensorBoard (upstream's spelling first).")
    board.add_argument("--no-log-loss-scale-to-tensorboard", action="store_false",
                       dest="log_loss_scale_to_tensorboard", help="Do not write the loss scale to TensorBoard.")
    board.add_argument("--log-validation-ppl-to-tensorboard", action="store_true",
                       help="Write validation perplexity to TensorBoard.")
    board.add_argument("--log-optimizer-states-to-tensorboard", action="store_true",
                       help="Write norms and extremes of Adam's moments and of the weights to TensorBoard.")
    board.add_argument("--log-memory-to-tensorboard", action="store_true",
                       help="Write the device memory in use (the process's resident memory on CPU).")
    wandb = parser.add_argument_group("Weights & Biases", "The TensorBoard scalars (same tags, x-axes and "
                                      "--log-*-to-tensorboard choices) also to W&B, from the last rank; needs the "
                                      "wandb package. WANDB_MODE=offline logs without network.")
    wandb.add_argument("--wandb-project", default="",
                       help="Log to this W&B project (upstream main's flag; with --wandb-exp-name alone, W&B's "
                            "default project).")
    wandb.add_argument("--wandb-exp-name", default="", help="The W&B run's name.")
    wandb.add_argument("--wandb-save-dir", default="",
                       help="W&B's local files go here (default: <--save>/wandb).")
    wandb.add_argument("--wandb-entity", help="The W&B team or user owning the project (Megatron-LM's flag).")
    wandb.add_argument("--wandb-required", action="store_true",
                       help="Stop the run when W&B cannot start (default: one warning line, training goes on).")


def validate(values: Mapping) -> None:
    """Needs --zero-stage settled."""
    for dest in ("tensorboard_log_interval", "tensorboard_queue_size"):
        if values[dest] < 1:
            raise InputError(f"--{dest.replace('_', '-')} {values[dest]} must be 1 or more")
    if values["log_num_zeros_in_grad"] and (values["zero_stage"] != 0 or values["fp16"] or values["bf16"]):
        raise InputError("--log-num-zeros-in-grad counts gradient entries per parameter, which DeepSpeed keeps "
                         "only with --zero-stage 0 in fp32 (ZeRO and --fp16/--bf16 hold them in flat "
                         "partitions); use --zero-stage 0 without --fp16/--bf16, or drop the flag")
    if values["log_optimizer_states_to_tensorboard"] and values["optimizer"] != "adam":
        raise InputError("--log-optimizer-states-to-tensorboard reports Adam's moments; it needs --optimizer "
                         "adam")
    if (values["wandb_project"] or values["wandb_exp_name"]) and not (values["save"] or values["wandb_save_dir"]):
        raise InputError("--wandb-project/--wandb-exp-name keep W&B's files in <--save>/wandb, but --save was not "
                         "given; add --save DIR or --wandb-save-dir DIR")
    if values["skip_train"] and not values["load"]:
        raise InputError("--skip-train evaluates the checkpoint in --load, but --load was not given; add "
                         "--load DIR (the --save directory of a training run)")
    if values["skip_train"] and not values["eval_iters"]:
        raise InputError("--skip-train with --eval-iters 0 evaluates nothing; give --eval-iters N (batches of "
                         "each split to evaluate)")


def section(values: Mapping) -> LoggingConfig:
    return same_named(LoggingConfig, values)
