"""Write the embedded demo corpus (the Python standard library's docstrings) as JSONL; no download."""
import argparse
import os
import sys


from megatron.data.demo_corpus import write_demo_corpus
from megatron.errors import InputError, run_cli


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", required=True, help="the JSONL file to write")
    parser.add_argument("--max-bytes", type=int, default=None, help="stop before the corpus grows past this size")
    args = parser.parse_args(argv)
    directory = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise InputError(f"--output {args.output!r}: directory {directory!r} does not exist or is not writable")
    documents, size = write_demo_corpus(args.output, args.max_bytes)
    print(f"Wrote {documents} documents ({size / 1e6:.1f} MB) to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
