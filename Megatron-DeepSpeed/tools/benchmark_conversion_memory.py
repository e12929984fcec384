"""Peak host memory (RSS) and seconds of reshaping a checkpoint with tools/convert_checkpoint.py's library
(megatron/checkpoint/reshape/conversions.reshape), which once assembled the whole model before writing and now reads each
target file's tensors when it writes it.

The source is a GPT of random fp32 weights (no training) at TP x PP (--source-tensor/--source-pipeline; made once
into --source, reused when it exists) in --source-layout: the pipeline engine's or the plain engine's (the
project's writer), Megatron's or DeepSpeed's ZeRO 3 at DP --source-data (tools/fixtures/checkpoint_sources.py). Each
conversion runs in its own process, so its peak RSS (the whole process: Python and torch included) and its CPU
seconds are its own: user (the work done in Python and torch) and system (the kernel's: page faults, copies into
the page cache, reclaiming memory for it, which varies with what else the machine caches and writes); with
--compare-root the same conversion runs with another checkout's `megatron` (e.g. a `git worktree` of an older
commit) as well, the two taking turns --repeat times, each first in every other turn. Each conversion starts alike:
the writes of the one before flushed to disk and its source read once into the page cache, so neither pays for the
other's writes or for the first read of the source from disk.

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_conversion_memory.py \\
      --source /tmp/src [--layers 20 --hidden 1536] [--source-layout megatron] \\
      [--compare-root /path/to/old/Megatron-DeepSpeed [--repeat 2]] [--keep-outputs DIR (to compare them with diff -r)]
"""
import argparse
import os
import shutil
import sys
import tempfile
from typing import Optional

from megatron.errors import InputError, RunError, run_cli
from megatron.reports.worker_runs import report, run_with_root

THIS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
RESULT_PREFIX = "conversion-memory: "
VOCAB = 50304  # GPT-2's 50257 padded to a multiple of 128


SOURCE_LAYOUTS = ("pipeline", "plain", "megatron", "zero3", "zero0", "zero1")


def write_random_source(directory: str, layers: int, hidden: int, heads: int, tensor: int, pipeline: int,
                        with_adam: bool, layout: str = "pipeline", data: int = 1) -> int:
    """A checkpoint of random weights (and Adam moments when `with_adam`) at TP `tensor` x PP `pipeline` (DP
    `data` for ZeRO 1 and 3) in `layout` (SOURCE_LAYOUTS: zero0 is the pipeline engine's, zero1 and zero3 the
    plain engine's); its parameter count."""
    import torch

    from fixtures.checkpoint_sources import write_megatron, write_zero0, write_zero12, write_zero3
    from megatron.checkpoint.formats.checkpoint import OptimizerState
    from megatron.config.recorded_flags import RecordedFlags
    from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
    from megatron.files.atomic import write_directory_atomically
    from megatron.model.gpt import GPTConfig, GPTModel

    config = GPTConfig(vocab_size=VOCAB, max_position_embeddings=1024, num_layers=layers, hidden_size=hidden,
                       num_attention_heads=heads, ffn_hidden_size=4 * hidden)
    with torch.device("meta"):  # shapes only: random values below, without the model's initialisation
        shapes = {name: tensor.shape for name, tensor in GPTModel(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    weights = {name: torch.randn(shape, generator=generator) * 0.02 for name, shape in shapes.items()}
    args = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "ffn_hidden_size": 4 * hidden,
            "max_position_embeddings": 1024, "seq_length": 1024, "seed": 1234, "tokenizer_type": "NullTokenizer",
            "tokenizer_vocab_size": VOCAB, "make_vocab_size_divisible_by": 128}
    adam = OptimizerState(step=10, fp32=weights, param_groups=RecordedFlags.of(args).adam_param_groups, **{
        kind: {name: torch.rand(shape, generator=generator) for name, shape in shapes.items()}
        for kind in ("exp_avg", "exp_avg_sq")}) if with_adam else None
    if layout == "megatron" and with_adam:
        raise RunError("--with-adam: Megatron's layout holds weights only")
    if layout in ("zero0", "zero1") and not with_adam:
        raise RunError(f"--source-layout {layout} is a source with Adam state: add --with-adam")
    write = {"pipeline": lambda out: write_checkpoint(out, weights, config, TrainingState(10, 80, args),
                                                      TargetLayout(tensor, pipeline), adam),
             "plain": lambda out: write_checkpoint(out, weights, config, TrainingState(10, 80, args),
                                                   TargetLayout(tensor, pipeline, pipeline_engine=False), adam),
             "megatron": lambda out: write_megatron(out, weights, args, tensor, pipeline, 10),
             "zero3": lambda out: write_zero3(out, weights, args, tensor, data, 10, adam),
             "zero0": lambda out: write_zero0(out, weights, config, TrainingState(10, 80, args),
                                              TargetLayout(tensor, pipeline), adam),
             "zero1": lambda out: write_zero12(out, weights, adam, args, tensor, data, 10)}[layout]
    write_directory_atomically(directory, write)
    return sum(weight.numel() for weight in weights.values())


def peak_rss() -> int:
    """This process's peak RSS in bytes: the kernel's high-water mark of its memory map (VmHWM), which starts
    afresh at exec, where getrusage's ru_maxrss keeps the parent's peak at the fork."""
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def convert_in_this_process(source: str, target: str, tensor: int, pipeline: int) -> dict:
    """Reshape `source` into `target` and measure it."""
    import time

    import psutil

    from megatron.checkpoint.reshape.conversions import reshape
    from megatron.checkpoint.reshape.target_writer import TargetLayout

    before = psutil.Process().memory_info().rss
    start, cpu_start = time.perf_counter(), os.times()
    reshape(source, target, TargetLayout(tensor, pipeline), force=True)
    cpu = os.times()
    return {"peak_rss": peak_rss(), "rss_before": before, "seconds": time.perf_counter() - start,
            "user_seconds": cpu.user - cpu_start.user, "system_seconds": cpu.system - cpu_start.system}


def settle(source: str) -> None:
    """Flush the writes still pending and read `source` once, so that a conversion starts with its source in the
    page cache and no earlier conversion's writes to wait for."""
    os.sync()
    for parent, _, names in os.walk(source):
        for name in names:
            with open(os.path.join(parent, name), "rb") as handle:
                while handle.read(1 << 24):
                    pass


def run(root: str, source: str, tensor: int, pipeline: int, keep: Optional[str] = None) -> dict:
    """One conversion in a fresh process with `root`'s megatron; its measurement (the output removed unless
    it is to be kept in `keep`)."""
    target = keep or tempfile.mkdtemp(prefix="conversion-target-")
    settle(source)
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--source", source, "--target", target,
               "--tensor", str(tensor), "--pipeline", str(pipeline)]
    try:
        return run_with_root(command, root, RESULT_PREFIX, {"OMP_NUM_THREADS": "1"})[0]
    finally:
        if keep is None:
            shutil.rmtree(target, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="the source checkpoint; written first when it is missing")
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--source-tensor", type=int, default=2)
    parser.add_argument("--source-pipeline", type=int, default=2)
    parser.add_argument("--source-data", type=int, default=2, help="the ZeRO-1 and ZeRO-3 sources' data-parallel size")
    parser.add_argument("--source-layout", choices=SOURCE_LAYOUTS, default="pipeline")
    parser.add_argument("--with-adam", action="store_true", help="the source made with Adam moments")
    parser.add_argument("--keep-outputs", help="keep each conversion's output in this directory, one folder per code")
    parser.add_argument("--tensor", type=int, default=1, help="the target's tensor-parallel size")
    parser.add_argument("--pipeline", type=int, default=1, help="the target's pipeline-parallel size")
    parser.add_argument("--compare-root", help="another checkout's Megatron-DeepSpeed directory")
    parser.add_argument("--repeat", type=int, default=1, help="run each checkout's conversion this many times")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        measured = convert_in_this_process(args.source, args.target, args.tensor, args.pipeline)
        report(RESULT_PREFIX, measured)
        return 0
    if args.repeat < 1:
        raise InputError(f"--repeat {args.repeat}: give 1 or more conversions per checkout")
    if args.keep_outputs and os.path.exists(args.keep_outputs):
        raise InputError(f"--keep-outputs {args.keep_outputs} exists; give a new directory (each conversion is "
                         "written into a folder of it)")
    if not os.path.exists(args.source):
        count = write_random_source(args.source, args.layers, args.hidden, args.heads, args.source_tensor,
                                    args.source_pipeline, args.with_adam, args.source_layout, args.source_data)
        print(f"wrote {args.source}: {count / 1e6:.0f}M parameters, {count * 4 / GIB:.2f} GiB in fp32, "
              f"{args.source_layout} layout, TP {args.source_tensor} x PP {args.source_pipeline}"
              f"{', Adam state' if args.with_adam else ''}")
    roots = [("this checkout", THIS_ROOT)] + ([("compare root", args.compare_root)] if args.compare_root else [])
    print(f"reshaping {args.source} to TP {args.tensor} x PP {args.pipeline}; GiB")
    print("| code | peak RSS | RSS before | seconds | user seconds | system seconds |")
    print("|---|---|---|---|---|---|")
    numbered = list(enumerate(roots))
    for turn in range(args.repeat):  # each checkout first in every other turn: a first run after a pause differs
        for index, (label, root) in numbered[::-1] if turn % 2 else numbered:
            keep = args.keep_outputs and turn == 0 and os.path.join(os.path.abspath(args.keep_outputs),
                                                                     f"output{index}")
            measured = run(root, os.path.abspath(args.source), args.tensor, args.pipeline, keep or None)
            print(f"| {label} | {measured['peak_rss'] / GIB:.2f} | {measured['rss_before'] / GIB:.2f} | "
                  f"{measured['seconds']:.1f} | {measured['user_seconds']:.1f} | {measured['system_seconds']:.1f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
