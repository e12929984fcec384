"""Checkpoint flags: where to save and load, and what a load restores and a save keeps (Megatron's names and
meanings, megatron/checkpoint/trainer/resume_plan.py); their checks, and the CheckpointConfig section."""
from typing import Mapping

from megatron.config.flags.common import Limits, same_named
from megatron.config.job import CheckpointConfig
from megatron.errors import InputError

LIMITS = Limits(positive=("save_interval",))
TRUST_FLAG = "--trust-checkpoint"  # also a flag of every checkpoint tool (megatron/checkpoint/trust.py)
TRUST_HELP = ("Let checkpoint files also hold this type or function (MODULE.NAME, as a refusal names it; repeat "
              "the flag for several). Building it can run its code: name only what you trust. Files are always "
              "read as data (torch.load weights_only): tensors, numbers, strings, containers, numpy arrays, "
              "argparse.Namespace, DeepSpeed's optimizer bookkeeping, and what this flag names.")
TRUST_ARGUMENTS = dict(action="append", metavar="MODULE.NAME", help=TRUST_HELP)


def add_flags(parser) -> None:
    group = parser.add_argument_group("checkpoints")
    group.add_argument("--save", help="Directory to save checkpoints to.")
    group.add_argument("--save-interval", type=int, help="Iterations between checkpoints.")
    group.add_argument("--load", help="Directory to resume from (a checkpoint at this run's layout, or one "
                                      "reshaped by tools/convert_checkpoint.py).")
    group.add_argument("--finetune", action="store_true",
                       help="Load only the weights from --load: iteration, optimizer, LR schedule and random "
                            "state start fresh.")
    group.add_argument("--no-load-optim", action="store_true",
                       help="Do not load the optimizer state from --load (it starts fresh).")
    group.add_argument("--no-load-rng", action="store_true",
                       help="Do not load the random generators' states from --load.")
    group.add_argument("--no-load-lr-state", action="store_true",
                       help="Accepted; always so here: no LR-scheduler state is saved (the schedule is a "
                            "function of the flags and the consumed samples).")
    group.add_argument("--universal-checkpoint", action="store_true",
                       help="Resume the DeepSpeed universal checkpoint that --load's latest_universal names (the "
                            "output of DeepSpeed's ds_to_universal), at any TP / PP / DP layout.")
    group.add_argument("--reset-iteration", action="store_true",
                       help="Load everything from --load but count iterations and consumed samples from 0.")
    group.add_argument("--override-lr-scheduler", "--override-opt_param-scheduler", action="store_true",
                       dest="override_lr_scheduler",
                       help="Use this command line's learning-rate schedule flags even if --load's differ "
                            "(--override-opt_param-scheduler: upstream main's name).")
    group.add_argument("--use-checkpoint-lr-scheduler", "--use-checkpoint-opt_param-scheduler", action="store_true",
                       dest="use_checkpoint_lr_scheduler",
                       help="Continue --load's learning-rate schedule, ignoring this command line's "
                            "(--use-checkpoint-opt_param-scheduler: upstream main's name).")
    group.add_argument("--no-save-optim", action="store_true",
                       help="Save checkpoints without the optimizer state (a resume then starts it fresh).")
    group.add_argument("--no-save-rng", action="store_true", default=None,
                       help="Save no random-generator states (a resume then keeps its own seeding).")
    group.add_argument(TRUST_FLAG, **TRUST_ARGUMENTS)


def validate(values: Mapping) -> None:
    """Needs --zero-stage settled."""
    if values["save"] is not None and values["save_interval"] is None:
        raise InputError(f"--save {values['save']} needs --save-interval N (iterations between checkpoints)")
    if values["no_save_optim"] and values["zero_stage"] == 3:
        raise InputError("--no-save-optim with --zero-stage 3: ZeRO-3 keeps the weights in its optimizer "
                         "partitions, so they cannot be left out; drop --no-save-optim or use --zero-stage 0-2")


def section(values: Mapping) -> CheckpointConfig:
    return same_named(CheckpointConfig, values, no_save_rng=bool(values["no_save_rng"]),
                      trust_checkpoint=tuple(values["trust_checkpoint"] or ()))
