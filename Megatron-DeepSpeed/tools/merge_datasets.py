"""Merge Megatron "mmap" indexed datasets (.bin/.idx pairs) into one, keeping document boundaries.

    python tools/merge_datasets.py --input DIR_OR_PREFIX [...] --output-prefix OUT

A directory contributes every .bin/.idx pair in it, in sorted order (as Megatron-LM's tool does);
anything else is taken as a dataset prefix (path without .bin/.idx).
"""
import argparse
import os

# Run from any working directory: the package lives one level above tools/.

from megatron.data.indexed_dataset import (
    MMapIndexedDataset, dataset_prefixes_in, merge_datasets)
from megatron.errors import InputError, run_cli


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", nargs="+", required=True, metavar="DIR_OR_PREFIX",
                        help="directories holding .bin/.idx pairs, or dataset prefixes")
    parser.add_argument("--output-prefix", required=True,
                        help="path of the merged dataset, without .bin/.idx")
    return parser.parse_args(argv)


def input_prefixes(inputs):
    """Expand directories into their datasets; check that every other input names a dataset."""
    prefixes = []
    for path in inputs:
        if os.path.isdir(path):
            prefixes.extend(dataset_prefixes_in(path))
        elif MMapIndexedDataset.exists(path):
            prefixes.append(path)
        else:
            raise InputError(f"--input {path}: neither a directory nor a dataset prefix (no "
                             f"{path}.bin/{path}.idx pair); give the path without .bin/.idx")
    return prefixes


def main(argv=None):
    args = parse_args(argv)
    prefixes = input_prefixes(args.input)
    merge_datasets(prefixes, args.output_prefix)
    merged = MMapIndexedDataset(args.output_prefix)
    print(f"merged {len(prefixes)} datasets into {args.output_prefix}.bin/.idx: "
          f"{len(merged)} items, {len(merged.doc_idx) - 1} documents")


if __name__ == "__main__":
    run_cli(main)
