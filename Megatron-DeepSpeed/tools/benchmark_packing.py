"""The same examples trained padded (one per row, padding left out of the loss) and packed (several per row, each
attending to itself only: segment ids and restarting position ids, model/attention_spec.py) on this machine's
device, with this device's kernels (FlexAttention's block mask on CUDA, SDPA with its mask built per call inside
the kernel elsewhere). Prints per layout the rows, the real tokens per second of forward + backward, the peak
memory (the device allocator's peak on an accelerator; the process's peak resident set on a CPU, each layout in
a process of its own), and the attention-mask bytes the batch carries: none for either (segment ids are
batch x seq int64), where --reset-attention-mask used to build a dense [batch, 1, seq, seq] bool mask (printed
for comparison).

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_packing.py \\
      [--examples 64] [--seq-length 1024] [--hidden-size 256] [--num-layers 4] [--repeats 3]
"""
import argparse
import multiprocessing
import resource
import statistics
import time

import torch

from megatron import device
from megatron.errors import InputError, run_cli
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.kernels import select_kernels

VOCAB = 1024


def example_lengths(count: int, seq_length: int) -> list:
    """Token counts from an eighth of the row to the whole row, as instruction data spreads them."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(seq_length // 8, seq_length + 1, (count,), generator=generator).tolist()


def padded_batch(lengths: list, seq_length: int) -> dict:
    rows = len(lengths)
    loss_mask = (torch.arange(seq_length)[None] < torch.tensor(lengths)[:, None]).float()
    return {"tokens": torch.randint(0, VOCAB, (rows, seq_length)), "loss_mask": loss_mask,
            "position_ids": torch.arange(seq_length).expand(rows, -1).contiguous(), "segment_ids": None}


def packed_batch(lengths: list, seq_length: int) -> dict:
    """First-fit: each example into the first row with room, a row's unused tail a document of its own."""
    rows = []
    for length in sorted(lengths, reverse=True):
        row = next((row for row in rows if sum(row) + length <= seq_length), None)
        if row is None:
            rows.append(row := [])
        row.append(length)
    segments, positions, loss_mask = [], [], []
    for row in rows:
        pieces = row + ([seq_length - sum(row)] if sum(row) < seq_length else [])
        segments.append(torch.cat([torch.full((n,), index) for index, n in enumerate(pieces)]))
        positions.append(torch.cat([torch.arange(n) for n in pieces]))
        loss_mask.append((torch.arange(seq_length) < sum(row)).float())
    return {"tokens": torch.randint(0, VOCAB, (len(rows), seq_length)), "loss_mask": torch.stack(loss_mask),
            "position_ids": torch.stack(positions), "segment_ids": torch.stack(segments)}


def measure(layout: str, args) -> dict:
    """Tokens/s and peak memory of `layout` ("padded" or "packed"): forward + backward of the whole batch."""
    lengths = example_lengths(args.examples, args.seq_length)
    batch = (padded_batch if layout == "padded" else packed_batch)(lengths, args.seq_length)
    where = device.current_device()
    config = GPTConfig(vocab_size=VOCAB, max_position_embeddings=args.seq_length, num_layers=args.num_layers,
                       hidden_size=args.hidden_size, num_attention_heads=args.hidden_size // 64, hidden_dropout=0.0,
                       attention_dropout=0.0, normalization="rmsnorm", add_position_embedding=False,
                       use_rotary_position_embeddings=True, swiglu=True, add_bias_linear=False,
                       kernels=select_kernels(device.device_name()))
    model = GPTModel(config).to(where)
    inputs = {name: None if tensor is None else tensor.to(where) for name, tensor in batch.items()}
    times = []
    device.reset_peak_memory()
    for _ in range(args.repeats + 1):  # the first is warm-up (and compilation)
        device.synchronize()
        start = time.perf_counter()
        model(inputs["tokens"], position_ids=inputs["position_ids"], segment_ids=inputs["segment_ids"],
              labels=inputs["tokens"], loss_mask=inputs["loss_mask"]).backward()
        device.synchronize()
        times.append(time.perf_counter() - start)
    peak = (device.memory_stats()["peak_allocated_bytes"] if device.device_name() != "cpu"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    rows = batch["tokens"].shape[0]
    return {"rows": rows, "tokens_per_s": sum(lengths) / statistics.median(times[1:]), "peak_bytes": peak,
            "dense_mask_bytes": rows * args.seq_length ** 2}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--hidden-size", type=int, default=256, help="a multiple of 64 (heads of 64)")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for flag, value in (("--examples", args.examples), ("--seq-length", args.seq_length),
                        ("--num-layers", args.num_layers), ("--repeats", args.repeats)):
        if value < 1:
            raise InputError(f"{flag} {value}: must be at least 1")
    if args.hidden_size < 64 or args.hidden_size % 64:
        raise InputError(f"--hidden-size {args.hidden_size}: must be a multiple of 64 (heads of 64 channels)")
    print(f"{args.examples} examples, --seq-length {args.seq_length}, {args.num_layers} layers of "
          f"{args.hidden_size}, {device.device_name()}")
    print("layout   rows  tokens/s   peak MiB  attention mask bytes (--reset-attention-mask's dense mask before)")
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        for layout in ("padded", "packed"):
            result = pool.apply(measure, (layout, args))
            before = f"{result['dense_mask_bytes']:,}" if layout == "packed" else "-"
            print(f"{layout:7} {result['rows']:5} {result['tokens_per_s']:9.0f} {result['peak_bytes'] / 2**20:10.1f}"
                  f"  0 ({before})")


if __name__ == "__main__":
    run_cli(main)
