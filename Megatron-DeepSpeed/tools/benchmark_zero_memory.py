"""Per-rank memory of ZeRO stages 0-3 at several data-parallel sizes, measured rather than derived: the bytes of
parameters, gradients and optimizer state each rank actually holds, found by inspecting the DeepSpeed engine
during a training step, so ZeRO's 1/DP partitioning shows up (or fails to) in real figures.

Each DP size is one launch of DP processes on the CPU, joined over gloo. Every process builds, once per stage,
the model of pretrain_gpt.py's model_provider with the optimizer and DeepSpeed config our flags give (fp32, no
offload), and trains two steps on random tokens. Counted are distinct storages (a view or a flat buffer counts
once, alignment padding included), each in one category, first match wins:
  parameters  the module's parameters and, under ZeRO-3, each one's partition (ds_tensor)
  gradients   after the second backward, before its optimizer step (DeepSpeed frees them in the step): the
              module's .grad and the gradient partitions the ZeRO optimizer keeps
  optimizer   after the step: Adam's state (exp_avg, exp_avg_sq, step) and the tensors Adam steps where they are
              not the model's own parameters, i.e. ZeRO's fp32 master partitions
The table shows the largest rank (ranks differ only by how parameters straddle partition boundaries).
Communication buckets and activations are not counted.

  python tools/benchmark_zero_memory.py [--dp 2 4] [--layers 8 --hidden 640 --heads 10 --vocab 16384 --seq 64]
"""
import argparse
import gc
import os
import socket

import torch
import torch.multiprocessing as mp

STAGES = (0, 1, 2, 3)
# Where DeepSpeed 0.19's ZeRO optimizers keep gradients between backward and step: stages 1/2 hand the step
# averaged_gradients (this rank's partition, per parameter) and may copy reduced gradients into the contiguous
# grads_in_partition; stage 3 keeps one flat buffer that its per-parameter partitions view.
ZERO_GRADIENT_HOLDERS = ("averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer")
MIB = 2 ** 20


def tensors_in(value):
    """Every tensor inside nested dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


class StorageLedger:
    """Bytes per category over distinct storages; a storage already booked under one category is not booked
    again under another."""

    def __init__(self):
        self.seen = set()

    def book(self, tensors) -> int:
        total = 0
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in self.seen:
                self.seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total


def parameter_tensors(engine):
    for parameter in engine.module.parameters():
        yield parameter
        if hasattr(parameter, "ds_tensor"):  # ZeRO-3: this rank's partition of a released parameter
            yield parameter.ds_tensor


def gradient_tensors(engine):
    yield from (p.grad for p in engine.module.parameters() if p.grad is not None)
    if engine.zero_optimization():
        for holder in ZERO_GRADIENT_HOLDERS:
            yield from tensors_in(getattr(engine.optimizer, holder, None))


def optimizer_tensors(engine):
    """Adam's state, keyed by the tensors it steps (ZeRO-3 puts those in param_groups only during its step):
    the model's parameters, already booked, or ZeRO's fp32 master partitions."""
    for stepped, state in engine.basic_optimizer.state.items():
        yield stepped
        yield from tensors_in(state)


def training_step(engine, batch, before_optimizer_step=None) -> None:
    from megatron.data.gpt_batch import model_inputs

    loss = engine(batch["tokens"], **model_inputs(batch))
    engine.backward(loss)
    if before_optimizer_step:
        before_optimizer_step()
    engine.step()


def measure_stage(stage: int, options, parallel, world_size: int) -> dict:
    """Bytes this rank holds under ZeRO `stage`, after one warm-up step (which creates Adam's state)."""
    import deepspeed

    from megatron import device
    from megatron.config.arguments import job_config, parse_args, validate_args
    from megatron.data.gpt_batch import make_batch
    from megatron.model.kernels import select_kernels
    from megatron.model.provider import model_provider
    from megatron.tensor_parallel import tensor_parallel_rng_tracker
    from megatron.tokenizer import build_tokenizer, vocab_size_with_padding
    from megatron.model.gpt_config import gpt_config
    from megatron.training.loop import build_engine

    argv = ["--num-layers", str(options.layers), "--hidden-size", str(options.hidden), "--num-attention-heads",
            str(options.heads), "--seq-length", str(options.seq), "--micro-batch-size", "1",
            "--global-batch-size", str(world_size), "--train-iters", "2", "--lr", "1e-4", "--lr-warmup-iters", "0",
            "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(options.vocab - 1),
            "--hidden-dropout", "0", "--attention-dropout", "0", "--zero-stage", str(stage),
            "--no-pipeline-parallel"]
    config = job_config(validate_args(parse_args(argv), world_size, device.device_name()))
    tokenizer = build_tokenizer(config.tokenizer.tokenizer_type, vocab_size=config.tokenizer.vocab_size)
    vocab = vocab_size_with_padding(tokenizer.vocab_size, config.tokenizer.make_vocab_size_divisible_by, 1)
    device.manual_seed(config.model.seed)
    kernels = select_kernels(device.device_name())
    model = model_provider(gpt_config(config.model, vocab, kernels), config.parallel, parallel,
                           tensor_parallel_rng_tracker(config.model.seed, 0))
    engine, _, _ = build_engine(model, config, kernels, parallel)
    batch = make_batch(torch.randint(0, tokenizer.vocab_size, (1, config.data.seq_length + 1)), tokenizer.eod)
    training_step(engine, batch)

    ledger, counts = StorageLedger(), {}

    def book_parameters_and_gradients():  # the parameters' storages stay the same through the step
        counts["parameters"] = ledger.book(parameter_tensors(engine))
        counts["gradients"] = ledger.book(gradient_tensors(engine))

    training_step(engine, batch, book_parameters_and_gradients)
    counts["optimizer"] = ledger.book(optimizer_tensors(engine))
    counts["model_parameters"] = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
    if not counts["gradients"]:
        raise RuntimeError(f"ZeRO {stage}: found no gradients; DeepSpeed {deepspeed.__version__} keeps them "
                           f"somewhere other than {ZERO_GRADIENT_HOLDERS}: update ZERO_GRADIENT_HOLDERS")
    engine.destroy()
    gc.collect()
    return counts


def rank_main(rank: int, world_size: int, port: int, options, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    import deepspeed

    from megatron.parallel_state import ParallelState

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    parallel = ParallelState()
    results.put((rank, {stage: measure_stage(stage, options, parallel, world_size) for stage in STAGES}))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(world_size: int, options) -> dict:
    """{stage: counts of the rank holding the most} for one data-parallel size."""
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(world_size, free_port(), options, results), nprocs=world_size, join=True)
    per_rank = [results.get()[1] for _ in range(world_size)]
    return {stage: max((ranks[stage] for ranks in per_rank),
                       key=lambda counts: counts["parameters"] + counts["gradients"] + counts["optimizer"])
            for stage in STAGES}


def table(by_dp: dict) -> list:
    columns = ("parameters", "gradients", "optimizer")
    lines = [f"{'ZeRO':>4} {'DP':>3} | {'params MiB':>10} {'grads MiB':>10} {'optim MiB':>10} {'total MiB':>10} | "
             f"ratio to ZeRO 0: {'params':>6} {'grads':>6} {'optim':>6} {'total':>6}"]
    for dp, by_stage in by_dp.items():
        baseline = by_stage[0]
        for stage, counts in by_stage.items():
            values = [counts[column] for column in columns]
            values.append(sum(values))
            reference = [baseline[column] for column in columns]
            reference.append(sum(reference))
            mib = " ".join(f"{value / MIB:10.1f}" for value in values)
            ratios = " ".join(f"{value / base:6.3f}" for value, base in zip(values, reference))
            lines.append(f"{stage:>4} {dp:>3} | {mib} | {'':16} {ratios}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4], help="data-parallel sizes (processes)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--heads", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=16384, help="vocabulary size, padded up to a multiple of 128")
    parser.add_argument("--seq", type=int, default=64)
    options = parser.parse_args()
    os.environ["DS_ACCELERATOR"] = "cpu"  # the ranks share this machine's CPU, whatever accelerator it has

    by_dp = {dp: measure(dp, options) for dp in options.dp}
    parameters = next(iter(by_dp.values()))[0]["model_parameters"]
    print(f"GPT {options.layers} layers, hidden {options.hidden}, {options.heads} heads, vocab {options.vocab} "
          f"(padded to a multiple of 128), seq {options.seq}: {parameters:,} parameters "
          f"({parameters * 4 / MIB:.1f} MiB in fp32)")
    print("fp32, no offload, gloo on CPU; bytes held by the largest rank during a training step "
          "(parameters and gradients after the backward, optimizer state after the step)")
    print("\n".join(table(by_dp)))


if __name__ == "__main__":
    main()
