"""CPU cost of an MoE training step at expert-parallel size 1 versus 2, at equal work.

Both runs train the same model (DeepSpeed's MoE layer in every second layer) on 2 processes over gloo with the same
global batch: at EP 1 each process holds every expert and runs its own tokens through them; at EP 2 each holds half
the experts and the tokens travel to them by all-to-all. Tokens are not dropped, so both do the same arithmetic;
the difference is the all-to-all and the smaller per-process expert weights and optimizer state. Printed: median
milliseconds per iteration and tokens/s of each (warm-up excluded, alternating rounds), and the parameters each
process holds.

  python tools/benchmark_moe.py [--layers 4 --hidden 256 --experts 8 --seq 256 --batch 4 --iters 12 --rounds 2]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from megatron.training.log_lines import parse_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP_ITERATIONS = 3
PARAMETERS = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank \(0, 0\): (\d+)")


def run(args, expert_parallel: int) -> tuple[float, int]:
    """(median ms per iteration, parameters on a process) of one 2-process run."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(args.port + expert_parallel), os.path.join(ROOT, "pretrain_gpt.py"), "--mock-data",
               "--tokenizer-type", "NullTokenizer", "--vocab-size", "8191", "--make-vocab-size-divisible-by", "1",
               "--num-layers", str(args.layers), "--hidden-size", str(args.hidden), "--num-attention-heads", "8",
               "--seq-length", str(args.seq), "--micro-batch-size", str(args.batch), "--train-iters", str(args.iters),
               "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1",
               "--eval-iters", "0", "--num-workers", "0", "--zero-stage", "0", "--no-pipeline-parallel",
               "--num-experts", str(args.experts), "--moe-expert-parallel-size", str(expert_parallel),
               "--disable-moe-token-dropping", "--distributed-backend", "gloo"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode:
        raise SystemExit(f"EP {expert_parallel} run failed:\n{result.stderr[-3000:]}")
    output = result.stdout + result.stderr
    milliseconds = [record.elapsed_ms for record in parse_log(output.splitlines()).iterations]
    return statistics.median(milliseconds[WARMUP_ITERATIONS:]), int(PARAMETERS.search(output).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4, help="micro batch per process (global = 2 x this)")
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2, help="alternate EP 1 and EP 2 runs this many times")
    parser.add_argument("--port", type=int, default=29611)
    args = parser.parse_args()
    rounds = [(run(args, 1), run(args, 2)) for _ in range(args.rounds)]
    tokens = 2 * args.batch * args.seq
    print(f"GPT {args.layers} layers (MoE in 2 and 4 ...), hidden {args.hidden}, {args.experts} experts, top-1, "
          f"seq {args.seq}, global batch {2 * args.batch}, fp32, 2 processes x 1 thread, gloo")
    for index, ep in enumerate((1, 2)):
        ms = statistics.median(round_[index][0] for round_ in rounds)
        print(f"EP {ep}: {ms:8.1f} ms/iteration  {tokens / ms * 1000:9,.0f} tokens/s  "
              f"{rounds[0][index][1]:,} parameters per process")


if __name__ == "__main__":
    main()
