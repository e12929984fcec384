"""Results table (markdown) and loss curves of finished training runs.

    python tools/results_table.py RUN_DIR... [--markdown OUT.md] [--plot OUT.png] [--upstream]

Each RUN_DIR is test/output/<run>/ as the entry scripts leave it (train.log + run.json). The table
has the seed project's columns, NAME (device) | params | PPL | samples/s | seq_len | Steps; with
--upstream, upstream's published rows for the same model sizes are put beside ours.
"""
import argparse

from megatron.errors import run_cli
from megatron.files.atomic import write_text_atomically
from megatron.reports.results import machine_notes, markdown_table, plot_loss_curves, read_run, table_rows

# Run from any working directory: the package lives one level above tools/.



def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (test/output/<run>/)")
    parser.add_argument("--markdown", metavar="OUT.md", help="also write the table to this file")
    parser.add_argument("--plot", metavar="OUT.png", help="draw the loss curves of all runs into this PNG")
    parser.add_argument("--upstream", action="store_true",
                        help="add upstream's published figures (8 GPUs / 8 NPUs) for the same model sizes")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    runs = [read_run(directory) for directory in args.run_dirs]
    text = markdown_table(table_rows(runs, args.upstream)) + "\n" + machine_notes(runs, args.upstream)
    print(text, end="")
    if args.markdown:
        write_text_atomically(args.markdown, text)
    if args.plot:
        plot_loss_curves(runs, args.plot)
    return 0


if __name__ == "__main__":
    run_cli(main)
