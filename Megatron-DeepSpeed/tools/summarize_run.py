"""The three closing lines of an entry script's run, and its loss curve.

    python tools/summarize_run.py RUN_DIR

Prints exactly `Final Performance samples/sec : X`, `Final Train lm loss PPL(accuracy): Y` and
`E2E Training Duration sec : Z` (the lines users' scripts grep), and writes RUN_DIR/loss_curve.png.
"""
import argparse
import os

from megatron.errors import run_cli
from megatron.reports.results import LOSS_CURVE_FILE, plot_loss_curves, read_run, summary_lines

# Run from any working directory: the package lives one level above tools/.



def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (test/output/<run>/)")
    args = parser.parse_args(argv)
    run = read_run(args.run_dir)
    plot_loss_curves([run], os.path.join(args.run_dir, LOSS_CURVE_FILE))
    print(summary_lines(run.summary), end="")
    return 0


if __name__ == "__main__":
    run_cli(main)
