"""Show a checkpoint (any layout convert_checkpoint.py reads, or a Hugging Face GPT-2 or Llama directory) as its
iteration, layout, key flags and every parameter at its full shape; or compare two.

    inspect_checkpoint.py A            name, shape, dtype and norm of every full tensor
    inspect_checkpoint.py A B [--atol X]   max absolute difference per tensor; exit status 1 when any exceeds X
"""
import argparse
import sys

from megatron.hf.examine import differences, examine, parameter_lines
from megatron.checkpoint.trust import add_trust_flag, trusting
from megatron.errors import InputError, run_cli
from megatron.reports.progress_bar import progress_bar


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("checkpoint", help="checkpoint directory (or a global_stepN in it), or a Hugging Face directory")
    parser.add_argument("other", nargs="?", help="a second one to compare with")
    parser.add_argument("--atol", type=float, default=0.0,
                        help="largest absolute difference that counts as equal (default 0: exactly equal)")
    add_trust_flag(parser)
    args = parser.parse_args(argv)
    if args.atol < 0:
        raise InputError(f"--atol {args.atol} must be 0 or more")
    return args


def main(argv=None):
    args = parse_args(argv)
    with trusting(args.trust_checkpoint):
        return show(args)


def show(args) -> int:
    with progress_bar(f"reading {args.checkpoint}") as progress:
        first = examine(args.checkpoint, progress)
    print("\n".join(first.header))
    if args.other is None:
        print("\n".join(parameter_lines(first.model)))
        return 0
    with progress_bar(f"reading {args.other}") as progress:
        second = examine(args.other, progress)
    print("\n".join(second.header))
    diffs = differences(first, second)
    width = max(len(name) for name in diffs)
    exceeding = [name for name, diff in diffs.items() if diff > args.atol]
    for name, diff in diffs.items():
        print(f"{name:<{width}}  max abs diff {diff:.6e}{'  > atol' if name in exceeding else ''}")
    print(f"{len(exceeding)} of {len(diffs)} tensors differ by more than {args.atol}")
    return 1 if exceeding else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
