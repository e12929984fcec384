"""Activation memory per rank under DeepSpeed-Ulysses (--ds-sequence-parallel-size), on CPU processes over gloo.

For each sequence-parallel size it starts that many torchrun processes, builds the GPT model as the trainer does
(model/ulysses.py around gpt.py, fp32, the portable kernels: PyTorch's fused attention, which keeps no score
matrix) and runs one forward and backward of one sequence per length. It counts the bytes of live tensors
(tools/benchmarks/live_memory.py, the count the planner is checked against) and prints, for the heaviest rank, what the
forward leaves for backward (the activations) and the peak of forward and backward together (gradients included).
Each rank holds 1/SP of every sequence, so both fall about as 1/SP. A tiny width and depth keep it to minutes.

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_ulysses_memory.py \\
      [--sizes 1 2 4] [--seq-lengths 8192 16384 32768] [--hidden-size 64] [--num-layers 2]
"""
import argparse
import os
import sys

from megatron.errors import run_cli
from megatron.reports.worker_runs import report, run_with_root

THIS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PREFIX = "ULYSSES_MEMORY "
MIB = 1 << 20
VOCAB = 256


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4], help="sequence-parallel sizes")
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def worker(options) -> None:
    """In a torchrun process: the model on this rank, then one step per sequence length; rank 0 reports the
    heaviest rank's figures."""
    import torch
    import torch.distributed as dist

    from megatron.data.gpt_batch import make_batch, sequence_chunk
    from megatron.model.gpt import GPTConfig, GPTModel, keep_whole
    from megatron.model.ulysses import ulysses_pieces
    from megatron.parallel_state import ParallelState, initialize_distributed
    from benchmarks.live_memory import LiveTensorBytes

    initialize_distributed("gloo", timeout_minutes=30)
    parallel = ParallelState(sequence_parallel_size=dist.get_world_size())
    config = GPTConfig(vocab_size=VOCAB, max_position_embeddings=max(options.seq_lengths),
                       num_layers=options.num_layers, hidden_size=options.hidden_size,
                       num_attention_heads=options.num_attention_heads, hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(config, ulysses_pieces(keep_whole, parallel))
    generator = torch.Generator().manual_seed(0)
    for length in options.seq_lengths:
        text = torch.randint(0, VOCAB, (1, length + 1), generator=generator)
        batch = sequence_chunk(make_batch(text, eod=VOCAB - 1), parallel.sp_rank, parallel.layout.sequence)
        model.zero_grad(set_to_none=True)
        with LiveTensorBytes() as live:
            loss = model(batch["tokens"], position_ids=batch["position_ids"], labels=batch["labels"],
                         loss_mask=batch["loss_mask"])
            activations = live.now
            loss.backward()
            peak = live.take_peak()
        heaviest = torch.tensor([activations, peak], dtype=torch.float64)
        dist.all_reduce(heaviest, op=dist.ReduceOp.MAX)
        if dist.get_rank() == 0:
            report(RESULT_PREFIX, {"sp": parallel.layout.sequence, "seq": length, "activations": heaviest[0].item(),
                                   "peak": heaviest[1].item(), "loss": loss.item()})


def measure(options, size: int) -> list:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(size),
               os.path.abspath(__file__), "--worker", "--seq-lengths", *map(str, options.seq_lengths),
               "--hidden-size", str(options.hidden_size), "--num-attention-heads", str(options.num_attention_heads),
               "--num-layers", str(options.num_layers)]
    return run_with_root(command, THIS_ROOT, RESULT_PREFIX, {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})


def main(argv=None) -> None:
    options = parse_args(argv)
    if options.worker:
        return worker(options)
    print(f"GPT, {options.num_layers} layers, hidden {options.hidden_size}, {options.num_attention_heads} heads, "
          f"vocabulary {VOCAB}, fp32, micro-batch 1; MiB per rank (the heaviest)")
    print("| sequence | SP | activations kept by forward | vs SP 1 | forward + backward peak | loss |")
    print("|---|---|---|---|---|---|")
    results = {(row["seq"], row["sp"]): row for size in options.sizes for row in measure(options, size)}
    for length in options.seq_lengths:
        baseline = results.get((length, options.sizes[0]))
        for size in options.sizes:
            row = results[(length, size)]
            ratio = row["activations"] / baseline["activations"]
            print(f"| {length} | {size} | {row['activations'] / MIB:.1f} | {ratio:.2f} | {row['peak'] / MIB:.1f} | "
                  f"{row['loss']:.4f} |")


if __name__ == "__main__":
    run_cli(main)
