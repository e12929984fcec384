"""Data flags: which .bin/.idx files (or synthetic tokens), the split, loading, and end-of-document handling;
their checks, and the DataConfig section."""
from typing import Mapping

from megatron.config.flags.common import Limits, after_preset, flag, same_named
from megatron.config.job import DataConfig
from megatron.errors import InputError

DATA_IMPLS = ("lazy", "cached", "mmap", "infer")
DATALOADER_TYPES = ("single", "cyclic")
LIMITS = Limits(non_negative=("num_workers",))
PRESET_DEFAULTS = {"split": "969, 30, 1"}


def add_flags(parser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--data-path", nargs="*",
                       help="One .bin/.idx prefix, or pairs: weight1 prefix1 weight2 prefix2 ...")
    group.add_argument("--train-data-path", nargs="*",
                       help="Upstream main: the train split's own prefix (or weight-prefix pairs), read whole; "
                            "instead of --data-path and --split. --valid-data-path and --test-data-path likewise.")
    group.add_argument("--valid-data-path", nargs="*", help="The validation split's own data (see --train-data-path).")
    group.add_argument("--test-data-path", nargs="*", help="The test split's own data (see --train-data-path).")
    group.add_argument("--split", help="Train,valid,test proportions. " + after_preset(PRESET_DEFAULTS["split"]))
    group.add_argument("--mock-data", action="store_true",
                       help="Train on synthetic tokens; no data files.")
    group.add_argument("--data-cache-path", help="Where to keep the sample index cache.")
    group.add_argument("--num-workers", type=int, default=2, help="Data loader workers.")
    group.add_argument("--eod-mask-loss", action="store_true",
                       help="Do not train on predicting end-of-document tokens.")
    group.add_argument("--reset-position-ids", action="store_true",
                       help="Restart position ids after each end-of-document token.")
    group.add_argument("--reset-attention-mask", action="store_true",
                       help="Do not attend across end-of-document tokens: each document attends within itself "
                            "(the batch carries segment ids; no [seq, seq] mask is built).")
    group.add_argument("--data-impl", choices=DATA_IMPLS, default="infer",
                       help="Accepted for every upstream value; all read the 'mmap' .bin/.idx files (a legacy "
                            "lazy/cached index is refused with a message saying how to convert it).")
    group.add_argument("--dataloader-type", choices=DATALOADER_TYPES,
                       help="single (default): one pass in Megatron's order; cyclic: each data-parallel rank "
                            "reads its share in a new random order every epoch, forever.")
    group.add_argument("--mmap-warmup", action="store_true",
                       help="Accepted; no effect (the data files are memory-mapped and read on demand).")
    group.add_argument("--repeated-dataloader", action="store_true",
                       help="Upstream main (finetune_llama.sh): read the data again once it is used up. Accepted; "
                            "the samples always cover every iteration (fine-tuning examples repeat epoch after "
                            "epoch in file order).")
    group.add_argument("--pack-sequences", action="store_true",
                       help="Fine-tuning (finetune_llama.py): several whole examples per sequence, each attending "
                            "only to itself with positions from 0, instead of one padded example per sequence.")
    group.add_argument("--overlong-examples", choices=("truncate", "drop"), default="truncate",
                       help="Fine-tuning: an example longer than --seq-length + 1 tokens is truncated (upstream's "
                            "way) or dropped; either is counted and reported per row.")


def after_parse(values: Mapping) -> dict:
    return {"dataloader_type": values["dataloader_type"] or "single"}


def validate(values: Mapping) -> None:
    if values["mock_data"] and values["data_path"]:
        raise InputError(f"--mock-data and --data-path {' '.join(values['data_path'])} were both "
                         f"given; drop one (--mock-data trains on synthetic tokens)")
    split_paths = [flag(dest) for dest in SPLIT_PATHS if values[dest]]
    if split_paths:
        _check_split_paths(values, split_paths)
    elif not values["mock_data"]:
        _check_data_path(values["data_path"])
    _check_split(values["split"])


SPLIT_PATHS = ("train_data_path", "valid_data_path", "test_data_path")


def _check_split_paths(values: Mapping, given: list) -> None:
    """Upstream main's per-split data: instead of --data-path (and --mock-data), with a train path."""
    for other in ("data_path", "mock_data"):
        if values[other]:
            raise InputError(f"{' and '.join(given)} give each split its own data; drop {flag(other)} (or use "
                             "--data-path with --split instead)")
    if not values["train_data_path"]:
        raise InputError(f"{' and '.join(given)} without --train-data-path: give the train split's data too")
    for dest in SPLIT_PATHS:
        if values[dest]:
            _check_data_path(values[dest], flag(dest))


def _check_data_path(data_path, name: str = "--data-path") -> None:
    if not data_path:
        raise InputError(f"{name} is required: give a .bin/.idx prefix or 'weight prefix' "
                         "pairs, or pass --mock-data to train on synthetic tokens")
    if len(data_path) == 1:
        return
    if len(data_path) % 2:
        raise InputError(f"{name} {' '.join(data_path)}: with several datasets give "
                         f"'weight prefix' pairs, but there are {len(data_path)} values")
    for weight in data_path[0::2]:
        try:
            ok = float(weight) > 0
        except ValueError:
            ok = False
        if not ok:
            raise InputError(f"{name} weight {weight!r} is not a positive number; "
                             f"write pairs like '--data-path 0.3 prefixA 0.7 prefixB'")


def _check_split(split: str) -> None:
    parts = split.replace("/", ",").split(",")
    try:
        weights = [float(part) for part in parts]
    except ValueError:
        weights = []
    if not weights or len(weights) > 3 or min(weights) < 0 or sum(weights) <= 0:
        raise InputError(f"--split {split!r} must be up to three non-negative numbers "
                         f"(train,valid,test) with a positive sum, e.g. '949,50,1'")


def section(values: Mapping) -> DataConfig:
    split_data_paths = tuple(tuple(values[dest] or ()) for dest in SPLIT_PATHS) if values["train_data_path"] else ()
    return same_named(DataConfig, values, data_path=tuple(values["data_path"] or ()),
                      split_data_paths=split_data_paths)
