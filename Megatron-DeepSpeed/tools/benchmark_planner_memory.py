"""The layout planner's memory estimate beside the real training step's peak, measured on this machine.

Each layout runs pretrain_gpt.py's training (DeepSpeed engine, random tokens, no evaluation) as a torchrun job on
the CPU over gloo, in bf16 unless --dtype says otherwise, counting the bytes of live tensors per rank
(tools/benchmarks/live_memory.py: what an accelerator's max_memory_allocated counts, less kernel workspaces and
allocator rounding). Printed per layout: the heaviest rank's peak in the first iteration (before Adam's moments
exist) and in the last (and whether before the optimizer's step, i.e. in forward, backward, gradient reduction and
DeepSpeed's preparation of the step, or in it), the planner's peak for the same flags (megatron/planning/memory.py,
its fragmentation allowance left out, as allocated bytes have none) with its phase, and the estimate's error
against the last iteration's peak.

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_planner_memory.py \\
      [--model-size 345M] [--micro-batch-size 2] [--num-layers 4] [--layouts zero1 recompute tp2 ...] [--json OUT]
"""
import argparse
import json
import os
import sys

from megatron.errors import InputError, run_cli
from megatron.reports.worker_runs import report, run_with_root

THIS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PREFIX = "planner-memory: "
GIB = 1 << 30
# name: (processes, data-parallel size, pretrain_gpt.py flags after the preset's and ONE_DEVICE)
ONE_DEVICE = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1"]
LAYOUTS = {"zero1": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "1"]),
           "zero0": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "0"]),
           "zero2": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "2"]),
           "zero3": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "3"]),
           "recompute": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "1", "--checkpoint-activations"]),
           "no-recompute": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "1", "--no-checkpoint-activations"]),
           "recompute-block": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "1", "--no-checkpoint-activations",
                                      "--recompute-granularity", "full", "--recompute-method", "block",
                                      "--recompute-num-layers", "1"]),
           "unfused-no-recompute": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "1", "--no-checkpoint-activations",
                                           "--no-masked-softmax-fusion"]),
           "unfused-selective": (1, 1, ["--no-pipeline-parallel", "--zero-stage", "1", "--no-checkpoint-activations",
                                        "--no-masked-softmax-fusion", "--recompute-granularity", "selective"]),
           "pipeline": (1, 1, ["--zero-stage", "1"]),
           "pipeline-no-recompute": (1, 1, ["--zero-stage", "1", "--no-checkpoint-activations"]),
           "tp2": (2, 1, ["--no-pipeline-parallel", "--zero-stage", "1", "--tensor-model-parallel-size", "2"]),
           "tp2-sp": (2, 1, ["--no-pipeline-parallel", "--zero-stage", "1", "--tensor-model-parallel-size", "2",
                             "--sequence-parallel"]),
           "pp2": (2, 1, ["--zero-stage", "1", "--pipeline-model-parallel-size", "2"]),
           "dp2": (2, 2, ["--no-pipeline-parallel", "--zero-stage", "1"])}


def training_flags(options, layout: str) -> list:
    """pretrain_gpt.py's flags for one layout: the preset's shape with the overrides, GPT-2's vocabulary size."""
    _, data_parallel, layout_flags = LAYOUTS[layout]
    shape = [] if options.num_layers is None else ["--num-layers", str(options.num_layers)]
    bucket = [] if options.zero_reduce_bucket_size is None else ["--zero-reduce-bucket-size",
                                                                  str(options.zero_reduce_bucket_size)]
    precision = [] if options.dtype == "fp32" else [f"--{options.dtype}"]
    global_batch = options.micro_batch_size * options.micro_batches * data_parallel
    return ["--model-size", options.model_size, *shape, "--mock-data", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "50256", "--micro-batch-size", str(options.micro_batch_size),
            "--global-batch-size", str(global_batch), "--train-iters", str(options.iterations), "--log-interval", "1",
            "--eval-iters", "0", "--num-workers", "0", *ONE_DEVICE, *bucket, *precision, *layout_flags]


def heaviest_peaks(options, layout: str) -> dict:
    """One layout's training in this process, a rank of its job: the heaviest rank's live-tensor peak per
    iteration before the optimizer's step and in it (every rank gets them). The tests call it on forked ranks."""
    import torch
    import torch.distributed as dist

    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    from tools.benchmarks.live_memory import record_iteration_peaks

    peaks = record_iteration_peaks(lambda: pretrain(model_provider, training_flags(options, layout)))
    heaviest = torch.tensor([*peaks.forward_backward, *peaks.optimizer_step], dtype=torch.float64)
    dist.all_reduce(heaviest, op=dist.ReduceOp.MAX)
    values = heaviest.tolist()
    return {"forward_backward": values[:options.iterations], "optimizer_step": values[options.iterations:]}


def worker(options) -> None:
    """One layout's training in this torchrun process; rank 0 reports the heaviest rank's peaks."""
    import torch.distributed as dist

    measured = heaviest_peaks(options, options.layout)
    if dist.get_rank() == 0:
        report(RESULT_PREFIX, measured)


def estimate(options, layout: str) -> dict:
    """The planner's peak for the layout's flags on this machine's CPU (its loss chunk), without fragmentation,
    and the phase it is in."""
    from megatron.planning.command_line import planned_memory
    from megatron.planning.memory import PHASES

    memory = planned_memory(training_flags(options, layout), LAYOUTS[layout][0], "cpu", fragmentation=0.0)
    return {"bytes": memory.total, "phase": memory.peak_phase,
            "terms": {term: getattr(memory, term) for terms in PHASES.values() for term in terms}}


def measure(options, layout: str) -> dict:
    """The heaviest rank's peak per iteration (before the optimizer's step, and in it) and the planner's."""
    processes = LAYOUTS[layout][0]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               os.path.abspath(__file__), "--worker", "--layout", layout, "--model-size", options.model_size,
               "--micro-batch-size", str(options.micro_batch_size), "--micro-batches", str(options.micro_batches),
               "--iterations", str(options.iterations), "--dtype", options.dtype]
    for flag in ("num_layers", "zero_reduce_bucket_size"):
        if getattr(options, flag) is not None:
            command += ["--" + flag.replace("_", "-"), str(getattr(options, flag))]
    measured, = run_with_root(command, THIS_ROOT, RESULT_PREFIX, {"DS_ACCELERATOR": "cpu"})
    return figures(options, layout, measured)


def figures(options, layout: str, measured: dict) -> dict:
    """heaviest_peaks' figures with each iteration's peak, beside the planner's estimate for the same flags."""
    measured["peak"] = [max(before, during) for before, during in
                        zip(measured["forward_backward"], measured["optimizer_step"])]
    return {"measured": measured, "estimate": estimate(options, layout)}


def row(layout: str, figures: dict) -> str:
    measured, planned = figures["measured"], figures["estimate"]
    last = measured["peak"][-1]
    where = "before" if measured["forward_backward"][-1] >= measured["optimizer_step"][-1] else "in"
    return (f"| {layout} | {measured['peak'][0] / GIB:.2f} | {last / GIB:.2f} ({where} the step) | "
            f"{planned['bytes'] / GIB:.2f} ({planned['phase']}) | {(planned['bytes'] - last) / last:+.1%} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-size", default="345M", help="a preset of pretrain_gpt.py's --model-size")
    parser.add_argument("--num-layers", type=int, help="override the preset's layer count (to fit this machine)")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=1, help="micro-batches per iteration and DP rank")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--zero-reduce-bucket-size", type=int, help="elements (default: DeepSpeed's, 5e8)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=["zero1", "recompute", "tp2", "pp2"])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--layout", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        return worker(options)
    if options.iterations < 2:
        raise InputError(f"--iterations {options.iterations}: give at least 2 (the first has no Adam moments)")
    print(f"{options.model_size}" + ("" if options.num_layers is None else f" with {options.num_layers} layers")
          + f", micro-batch {options.micro_batch_size}, {options.dtype}; peak GiB of the heaviest rank")
    print("| layout | measured, first iteration | measured, last iteration | planner | planner vs last |")
    print("|---|---|---|---|---|")
    results = {}
    for layout in options.layouts:
        results[layout] = measure(options, layout)
        print(row(layout, results[layout]), flush=True)
    if options.json:
        from megatron.files.atomic import write_text_atomically
        write_text_atomically(options.json, json.dumps(results, indent=1))


if __name__ == "__main__":
    run_cli(main)
