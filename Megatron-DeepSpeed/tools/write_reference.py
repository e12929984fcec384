"""Write the generated reference pages of docs/ (docs/flags.md: every flag from the parsers; docs/errors.md: every
one-line error from the source; the presets table in docs/training.md). Run from the repository root after
changing a flag, a preset or an error message:

    .venv/bin/python Megatron-DeepSpeed/tools/write_reference.py          # rewrite the pages
    .venv/bin/python Megatron-DeepSpeed/tools/write_reference.py --check  # exit 1 naming the pages that differ
"""
import argparse
import os
import sys

from megatron.errors import run_cli
from megatron.files.atomic import write_text_atomically
from megatron.reference.pages import current_texts, stale_pages

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed page differs")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(REPO_ROOT)
        for page in stale:
            print(f"{page} differs from the code", file=sys.stderr)
        return 1 if stale else 0
    for page, text in current_texts(REPO_ROOT).items():
        write_text_atomically(os.path.join(REPO_ROOT, page), text)
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
