"""Fine-tuning throughput and memory, the same examples padded (one per sequence) and packed (--pack-sequences):
real (not padding) tokens per second of forward + backward over one epoch, the sequences it took, the peak bytes
of live tensors of one micro-batch step (torch's allocator peak on an accelerator; counted from torch's dispatcher
on a CPU: tools/benchmarks/live_memory.py), and the bytes of the attention mask each builds (none for either:
padded rows are plain causal, packed ones carry segment ids; --reset-attention-mask's dense mask for comparison).
The examples' lengths are drawn from a log-normal, as instruction data's skew: most short, a few long.

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_sft_packing.py \\
      [--examples 128] [--seq-length 1024] [--micro-batch-size 4] [--hidden-size 256] [--num-layers 4]
"""
import argparse
import time

import numpy as np
import torch

from megatron import device
from megatron.data.sft_batch import SFTBatchMaker
from megatron.data.sft_dataset import ExampleList, PackedExamples, PaddedExamples, pack_bins
from megatron.data.sft_examples import Example
from megatron.errors import run_cli
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.tokenizer import require_positive_int

VOCAB = 8192


def skewed_examples(count: int, limit: int, seed: int = 0) -> ExampleList:
    """`count` examples of log-normal lengths (median limit / 8) within `limit`, the first 60% of each a prompt."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(limit / 8), 0.8, count).astype(int), 8, limit)
    return ExampleList(Example.of(rng.integers(3, VOCAB, length), np.arange(length) >= int(length * 0.6))
                       for length in lengths)


def micro_batches(dataset, micro_batch_size: int, packed: bool) -> list:
    make = SFTBatchMaker(packed)
    return [make([dataset[i] for i in range(first, min(first + micro_batch_size, len(dataset)))])
            for first in range(0, len(dataset), micro_batch_size)]


def step(model: GPTModel, batch: dict, target) -> None:
    loss = model(batch["tokens"].to(target), position_ids=batch["position_ids"].to(target), attention_mask=None,
                 labels=batch["labels"].to(target), loss_mask=batch["loss_mask"].to(target))
    loss.backward()


def measure(model: GPTModel, batches: list) -> tuple[float, int]:
    """(seconds of one epoch, after one warm-up step; peak bytes of one step of the longest batch)."""
    from benchmarks.live_memory import LiveTensorBytes  # tools/benchmarks/: on the path when run as a tool
    target = model.device
    step(model, batches[0], target)
    device.synchronize()
    start = time.perf_counter()
    for batch in batches:
        step(model, batch, target)
    device.synchronize()
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    largest = max(batches, key=lambda batch: batch["tokens"].numel())
    if device.device_name() == "cpu":
        with LiveTensorBytes() as live:
            step(model, largest, target)
        peak = live.peak
    else:
        device.reset_peak_memory()
        baseline = device.memory_stats()["allocated_bytes"]
        step(model, largest, target)
        peak = device.memory_stats()["peak_allocated_bytes"] - baseline
    model.zero_grad(set_to_none=True)
    return seconds, peak


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=128)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=4)
    args = parser.parse_args(argv)
    for flag in ("examples", "seq_length", "micro_batch_size", "hidden_size", "num_layers"):
        require_positive_int("--" + flag.replace("_", "-"), getattr(args, flag))
    limit = args.seq_length + 1
    examples = skewed_examples(args.examples, limit)
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(vocab_size=VOCAB, max_position_embeddings=args.seq_length, num_layers=args.num_layers,
                               hidden_size=args.hidden_size, num_attention_heads=max(1, args.hidden_size // 64),
                               hidden_dropout=0.0, attention_dropout=0.0, normalization="rmsnorm",
                               add_position_embedding=False, use_rotary_position_embeddings=True, swiglu=True,
                               add_bias_linear=False)).to(device.current_device())
    real_tokens = int(examples.lengths().sum())
    print(f"{args.examples} examples, {real_tokens} tokens (median length {int(np.median(examples.lengths()))}), "
          f"--seq-length {args.seq_length}, micro-batch {args.micro_batch_size}, {device.device_name()}")
    print(f"{'':8} {'sequences':>9} {'padding':>8} {'tokens/s':>10} {'peak MiB':>9} {'mask bytes':>10}")
    for name, kind, count in (("padded", PaddedExamples, len(examples)),
                              ("packed", PackedExamples, len(pack_bins(examples.lengths(), limit)))):
        batches = micro_batches(kind(examples, limit, 0, count), args.micro_batch_size, kind is PackedExamples)
        seconds, peak = measure(model, batches)
        padding = 1 - real_tokens / (count * limit)
        print(f"{name:8} {count:9d} {padding:8.1%} {real_tokens / seconds:10.0f} {peak / 2**20:9.1f} {0:10d}")
    dense = args.micro_batch_size * args.seq_length ** 2
    print(f"(--reset-attention-mask's dense [b, 1, s, s] bool mask at this shape: {dense} bytes a micro-batch)")


if __name__ == "__main__":
    run_cli(main)
