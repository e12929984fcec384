"""Correctness and speed report for the accelerator of this host (see megatron/reports/device_check.py).

    bash Megatron-DeepSpeed/tools/device_check.sh [--cpu] [--iterations N] [--output report.md]
        [--only correctness|speed] [--shapes 345M,1.3B,345M-MoE8]
"""
import argparse
import os

from megatron.errors import InputError, run_cli
from megatron.files.atomic import write_text_atomically
from megatron.reports.device_check import CHECKS, report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run the reduced CPU check even beside an accelerator")
    parser.add_argument("--iterations", type=int, help="training iterations per run (default 50; 4 on CPU)")
    parser.add_argument("--output", help="also write the report to this file")
    parser.add_argument("--only", choices=CHECKS, help="run only the correctness or only the speed checks")
    parser.add_argument("--shapes", help="comma-separated shape names to run (e.g. 345M,1.3B,345M-MoE8; tiny, toy, "
                                         "toy-MoE4 on CPU); default all")
    options = parser.parse_args(argv)
    if options.output and os.path.exists(options.output):
        raise InputError(f"--output {options.output} already exists; choose another file, or remove it first")
    if options.cpu:
        os.environ["DS_ACCELERATOR"] = "cpu"  # before DeepSpeed is imported: it picks its accelerator once
    from deepspeed_npu import activate
    npu = activate()  # on an Ascend host: the NPU accelerator, or one line saying what is missing

    from megatron import device
    from megatron.model.kernels import select_kernels
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    on_accelerator = device.device_name() != "cpu"
    iterations = options.iterations or (50 if on_accelerator else 4)
    lines = []

    def say(text):
        print(text, flush=True)
        lines.append(text)

    say(f"NPU adaptor: {npu.summary}")
    report(on_accelerator, lambda argv: pretrain(model_provider, argv, adaptor_kernels=npu.kernels), iterations,
           say, select_kernels(device.device_name(), npu.kernels).attention,
           checks=[options.only] if options.only else CHECKS,
           shapes=options.shapes.split(",") if options.shapes else None)
    if options.output:
        write_text_atomically(options.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    run_cli(main)
