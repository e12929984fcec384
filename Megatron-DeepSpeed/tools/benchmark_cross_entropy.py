"""Time and memory of the language-model loss, forward and backward, on this machine's device:
megatron/model/cross_entropy.py, eager and with its chunk math compiled (--torch-compile), against torch's
F.cross_entropy on an fp32 copy of the logits (what the model did before, and what upstream does). Prints ms
per step (the compiled row after its compilation) and, on an accelerator, the peak memory above the logits.

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_cross_entropy.py \\
      [--tokens 16384] [--vocab 50304] [--dtype bf16] [--repeats 10]
"""
import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F

from megatron import device
from megatron.errors import InputError, run_cli
from megatron.model.cross_entropy import compiled_chunk_kernels, cross_entropy

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_fp32_copy(logits, labels):
    return F.cross_entropy(logits.float(), labels, reduction="none")


def measure(loss_fn, logits, labels, repeats: int) -> tuple[float, float]:
    """(median ms of forward + backward, peak bytes allocated above the inputs; None where the device keeps none)."""
    times = []
    for _ in range(repeats + 2):  # the first two are warm-up (compilation, one per chunk shape)
        logits.grad = None
        device.synchronize()
        device.reset_peak_memory()
        baseline = device.memory_stats()["allocated_bytes"]
        start = time.perf_counter()
        loss_fn(logits, labels).mean().backward()
        device.synchronize()
        times.append(time.perf_counter() - start)
    peak = device.memory_stats()["peak_allocated_bytes"] - baseline if device.device_name() != "cpu" else None
    return statistics.median(times[2:]) * 1e3, peak


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384, help="rows of logits (micro batch x seq length)")
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    for flag, value in (("--tokens", args.tokens), ("--vocab", args.vocab), ("--repeats", args.repeats)):
        if value < 1:
            raise InputError(f"{flag} {value}: must be at least 1")
    dtype = DTYPES[args.dtype]
    if not device.supports_dtype(dtype):
        raise InputError(f"--dtype {args.dtype}: not supported on {device.device_name()}; pick another")
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(args.tokens, args.vocab, generator=generator).to(device.current_device(), dtype)
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=generator).to(device.current_device())
    logits.requires_grad_(True)
    print(f"{device.device_model_name()}: {args.tokens} x {args.vocab} logits, {args.dtype}, "
          f"{logits.numel() * logits.element_size() / 2 ** 30:.2f} GiB")
    compiled = functools.partial(cross_entropy, kernels=compiled_chunk_kernels())
    for name, loss_fn in (("F.cross_entropy(logits.float())", torch_fp32_copy),
                          ("megatron.model.cross_entropy", cross_entropy),
                          ("megatron.model.cross_entropy, compiled", compiled)):
        milliseconds, peak = measure(loss_fn, logits, labels, args.repeats)
        memory = "n/a (CPU)" if peak is None else f"{peak / 2 ** 30:.2f} GiB"
        print(f"  {name:34s} {milliseconds:8.1f} ms   peak above inputs {memory}")


if __name__ == "__main__":
    run_cli(main)
