"""Correctness and speed report for the accelerator of this host (see megatron/reports/device_check.py).

    bash Megatron-DeepSpeed/tools/device_check.sh [--cpu] [--iterations N] [--output report.md]
        [--report-dir DIR] [--only correctness|speed] [--shapes 345M,1.3B,345M-MoE8] [--nproc N]
        [--log-interval N]

--report-dir DIR (a new directory) receives the whole report: report.md (every line printed, the speed table
included), speed.json (the speed rows) and logs.txt (each speed cell's command and whole output).

--nproc N (default: every device of this node; 1 on the CPU) also checks the parallel layouts N devices allow
(DP2, TP2, PP2, TP2xPP2xDP2) against one device, and times the first speed cell at each: run it on a new node
before a long job.
"""
import argparse
import dataclasses
import json
import os

from megatron.errors import InputError, run_cli
from megatron.files.atomic import write_directory_atomically, write_text_atomically
from megatron.reports.device_check import CHECKS, SPEED_LOG_INTERVAL, report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run the reduced CPU check even beside an accelerator")
    parser.add_argument("--iterations", type=int, help="training iterations per run (default 20, two windows of 10 of "
                                                       "which the second is timed; 4 on CPU)")
    parser.add_argument("--output", help="also write the report to this file")
    parser.add_argument("--report-dir", help="write the report, the speed rows as JSON and every speed cell's log "
                                             "into this new directory")
    parser.add_argument("--log-interval", type=int, default=SPEED_LOG_INTERVAL,
                        help=f"iterations per logged window of an accelerator's speed cells (default "
                             f"{SPEED_LOG_INTERVAL}); the first window is not timed")
    parser.add_argument("--only", choices=CHECKS, help="run only the correctness or only the speed checks")
    parser.add_argument("--shapes", help="comma-separated shape names to run (e.g. 345M,1.3B,345M-MoE8; tiny, toy, "
                                         "toy-MoE4 on CPU); default all")
    parser.add_argument("--nproc", type=int, help="devices to check the parallel layouts on (default: all of this "
                                                   "node's; 1 on the CPU, where each is a process)")
    options = parser.parse_args(argv)
    if options.nproc is not None and options.nproc < 1:
        raise InputError(f"--nproc {options.nproc}: give a number of devices of at least 1")
    if options.log_interval < 1:
        raise InputError(f"--log-interval {options.log_interval}: give a number of iterations of at least 1")
    for flag, path, kind in (("--output", options.output, "file"), ("--report-dir", options.report_dir, "directory")):
        if path and os.path.exists(path):
            raise InputError(f"{flag} {path} already exists; choose another {kind}, or remove it first")
    if options.cpu:
        os.environ["DS_ACCELERATOR"] = "cpu"  # before DeepSpeed is imported: it picks its accelerator once
    from deepspeed_npu import activate
    npu = activate()  # on an Ascend host: the NPU accelerator, or one line saying what is missing

    from megatron import device
    from megatron.model.kernels import select_kernels
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    on_accelerator = device.device_name() != "cpu"
    iterations = options.iterations or (2 * options.log_interval if on_accelerator else 4)
    nproc = options.nproc or (device.device_count() if on_accelerator else 1)
    lines = []

    def say(text):
        print(text, flush=True)
        lines.append(text)

    say(f"NPU adaptor: {npu.summary}")
    cell_logs = []
    rows = report(on_accelerator, lambda argv: pretrain(model_provider, argv, adaptor_kernels=npu.kernels),
                  iterations, say, select_kernels(device.device_name(), npu.kernels).attention,
                  checks=[options.only] if options.only else CHECKS,
                  shapes=options.shapes.split(",") if options.shapes else None, nproc=nproc,
                  log_interval=options.log_interval, keep_log=cell_logs.append)
    if options.output:
        write_text_atomically(options.output, "\n".join(lines) + "\n")
    if options.report_dir:
        write_report_directory(options.report_dir, lines, rows, cell_logs)


def write_report_directory(path: str, lines: list, rows: list, cell_logs: list) -> None:
    """report.md, speed.json and logs.txt in a new directory that appears whole or not at all."""
    files = {"report.md": "\n".join(lines) + "\n",
             "speed.json": json.dumps([dataclasses.asdict(row) for row in rows], indent=1) + "\n",
             "logs.txt": "\n\n".join(cell_logs) + "\n"}

    def fill(directory: str) -> None:
        for name, text in files.items():
            write_text_atomically(os.path.join(directory, name), text)

    write_directory_atomically(path, fill)


if __name__ == "__main__":
    run_cli(main)
