"""Checkpoint flags of Megatron-DeepSpeed beyond those of megatron/config/arguments.py (--finetune, --no-load-optim,
--no-load-rng, --no-save-optim and the LR-scheduler pair live there)."""


def add_flags(parser) -> None:
    group = parser.add_argument_group("checkpoint contents")
    group.add_argument("--no-save-rng", action="store_true", default=None,
                       help="Save no random-generator states (a resume then keeps its own seeding).")
    group.add_argument("--no-load-lr-state", action="store_true",
                       help="Accepted; always so here: no LR-scheduler state is saved (the schedule is a "
                            "function of the flags and the consumed samples).")
    group.add_argument("--reset-iteration", action="store_true",
                       help="Load everything from --load but count iterations and consumed samples from 0.")
