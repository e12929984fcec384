"""What the tools show people about runs, outside training: results tables from run directories, the
accelerator correctness and speed report, and the one line a failing job prints."""
