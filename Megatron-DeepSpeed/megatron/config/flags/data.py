"""Data-loading flags of Megatron-DeepSpeed beyond the core set."""

DATA_IMPLS = ("lazy", "cached", "mmap", "infer")
DATALOADER_TYPES = ("single", "cyclic")


def add_flags(parser) -> None:
    group = parser.add_argument_group("data loading")
    group.add_argument("--data-impl", choices=DATA_IMPLS, default="infer",
                       help="Accepted for every upstream value; all read the 'mmap' .bin/.idx files (a legacy "
                            "lazy/cached index is refused with a message saying how to convert it).")
    group.add_argument("--dataloader-type", choices=DATALOADER_TYPES,
                       help="single (default): one pass in Megatron's order; cyclic: each data-parallel rank "
                            "reads its share in a new random order every epoch, forever.")
    group.add_argument("--mmap-warmup", action="store_true",
                       help="Accepted; no effect (the data files are memory-mapped and read on demand).")


def after_parse(args) -> None:
    if args.dataloader_type is None:
        args.dataloader_type = "single"
