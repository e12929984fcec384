"""Step time of tensor + sequence parallel training on 2 CPU processes, where the sequence-parallel gradient
reduction is a visible share of the step: many thin layers (each has four LayerNorm and two row-parallel bias
tensors to sum over the tensor-parallel pair) and several micro-batches per step.

It runs pretrain_gpt.py (torchrun, TP 2, --sequence-parallel, mock data, fp32) from one checkout, or alternately
from two (--compare-root, e.g. a `git worktree` of an older commit), and prints the median iteration time of
each, warm-up iterations left out, round by round and over all rounds (a shared machine drifts by 10-20% from
minute to minute, so rounds alternate).

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_sp_grad_reduction.py \\
      [--compare-root /path/to/old/Megatron-DeepSpeed] [--rounds 3] [-- extra pretrain_gpt.py flags]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys

from megatron.errors import run_cli
from megatron.training.log_lines import parse_log

THIS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP_ITERATIONS = 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pretrain_flags(args) -> list:
    return ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "255", "--make-vocab-size-divisible-by", "128",
            "--num-layers", str(args.layers), "--hidden-size", str(args.hidden), "--num-attention-heads", "4",
            "--seq-length", str(args.seq), "--max-position-embeddings", str(args.seq),
            "--micro-batch-size", str(args.micro_batch), "--global-batch-size", str(args.global_batch),
            "--train-iters", str(args.iters), "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout", "0",
            "--log-interval", "1", "--eval-iters", "0", "--num-workers", "0", "--zero-stage", str(args.zero_stage),
            *args.extra]


def median_iteration_ms(root: str, args) -> float:
    """Median milliseconds per iteration of one 2-process run of `root`'s pretrain_gpt.py."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), os.path.join(root, "pretrain_gpt.py"), *pretrain_flags(args)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
                   "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    milliseconds = [record.elapsed_ms for record in parse_log(result.stdout).iterations]
    if len(milliseconds) <= WARMUP_ITERATIONS:
        raise RuntimeError(f"{root}: only {len(milliseconds)} iteration lines; raise --iters")
    return statistics.median(milliseconds[WARMUP_ITERATIONS:])


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=THIS_ROOT, help="the Megatron-DeepSpeed directory to run (default: this one)")
    parser.add_argument("--compare-root", help="a second Megatron-DeepSpeed directory, run alternately with --root")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=16, help="micro-batches per step: this / micro batch")
    parser.add_argument("--zero-stage", type=int, default=1, choices=(0, 1))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="more pretrain_gpt.py flags, after --")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    roots = [args.root] + ([args.compare_root] if args.compare_root else [])
    times = {root: [] for root in roots}
    print(f"TP 2 + sequence parallel on 2 CPU processes: {args.layers} layers, hidden {args.hidden}, seq {args.seq}, "
          f"{args.global_batch // args.micro_batch} micro-batches of {args.micro_batch} per step, "
          f"ZeRO {args.zero_stage}, fp32 {' '.join(args.extra)}", flush=True)
    for round_number in range(1, args.rounds + 1):
        for root in roots:
            times[root].append(median_iteration_ms(root, args))
            print(f"round {round_number}: {root}: {times[root][-1]:.1f} ms per iteration", flush=True)
    for root in roots:
        print(f"median over {args.rounds} rounds: {root}: {statistics.median(times[root]):.1f} ms per iteration")
    return 0


if __name__ == "__main__":
    run_cli(main)
