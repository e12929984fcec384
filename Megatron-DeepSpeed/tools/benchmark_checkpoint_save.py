"""Seconds of saving a plain-engine (--no-pipeline-parallel) checkpoint through the trainer's save_checkpoint
(megatron/checkpoint/trainer/save.py): DeepSpeed's save plus what the trainer does around it. Rank 0 once
rewrote every model-states file afterwards to nest `module` as upstream's GPTModel does; each rank now writes
it nested.

One process (gloo, world 1) builds a GPT of --layers/--hidden with torch's AdamW, takes one optimizer step on
zero gradients (so the model-states file holds the Adam moments, as in training at ZeRO 0) and saves it
--repeats times; with --compare-root the same runs with another checkout's `megatron` (e.g. `git archive` of an
older commit), the two alternating. Each run is its own process.

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_checkpoint_save.py \\
      [--layers 12 --hidden 768] [--repeats 3] [--compare-root /path/to/old/Megatron-DeepSpeed]
"""
import argparse
import os
import shutil
import socket
import sys
import tempfile
import time

from megatron.errors import run_cli
from megatron.reports.worker_runs import report, run_with_root

THIS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PREFIX = "checkpoint-save: "
VOCAB = 50304  # GPT-2's 50257 padded to a multiple of 128
MIB = 1 << 20


def save_in_this_process(layers: int, hidden: int, heads: int, save_dir: str) -> dict:
    """Build the engine, save once; seconds of the save and the size of the model-states file."""
    import deepspeed
    import torch
    import torch.distributed as dist

    from megatron.checkpoint.trainer.save import save_checkpoint
    from megatron.model.gpt import GPTConfig, GPTModel
    from megatron.tensor_parallel import tensor_parallel_rng_tracker

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # what torchrun gives one process (DeepSpeed reads LOCAL_RANK)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    config = GPTConfig(vocab_size=VOCAB, max_position_embeddings=1024, num_layers=layers, hidden_size=hidden,
                       num_attention_heads=heads, ffn_hidden_size=4 * hidden)
    model = GPTModel(config)
    optimizer = torch.optim.AdamW(model.parameters())
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # Adam's moments exist, as after a training step
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config={
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0}})
    flags = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "ffn_hidden_size": 4 * hidden,
             "max_position_embeddings": 1024, "seq_length": 1024, "seed": 1234, "zero_stage": 0,
             "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "data_parallel_size": 1,
             "no_pipeline_parallel": True, "ds_pipeline_enabled": False, "tokenizer_type": "NullTokenizer"}
    start = time.perf_counter()
    step_dir = save_checkpoint(engine, save_dir, flags, 1, 8, tensor_parallel_rng_tracker(1234, 0), VOCAB)
    seconds = time.perf_counter() - start
    dist.destroy_process_group()
    return {"seconds": seconds, "bytes": os.path.getsize(os.path.join(step_dir, "mp_rank_00_model_states.pt"))}


def run(root: str, layers: int, hidden: int, heads: int) -> dict:
    """One save in a fresh process with `root`'s megatron (its output removed)."""
    save_dir = tempfile.mkdtemp(prefix="checkpoint-save-")
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--save", save_dir, "--layers", str(layers),
               "--hidden", str(hidden), "--heads", str(heads)]
    try:
        return run_with_root(command, root, RESULT_PREFIX)[0]
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-root", help="another checkout's Megatron-DeepSpeed directory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        measured = save_in_this_process(args.layers, args.hidden, args.heads, args.save)
        report(RESULT_PREFIX, measured)
        return 0
    roots = [("this checkout", THIS_ROOT)] + ([("compare root", args.compare_root)] if args.compare_root else [])
    seconds = {label: [] for label, _ in roots}
    for _ in range(args.repeats):
        for label, root in roots:
            measured = run(root, args.layers, args.hidden, args.heads)
            seconds[label].append(measured["seconds"])
            print(f"{label}: {measured['seconds']:.1f} s (model-states file {measured['bytes'] / MIB:.0f} MiB)",
                  flush=True)
    for label, values in seconds.items():
        print(f"| {label} | seconds per save: {' '.join(f'{value:.1f}' for value in values)} | median "
              f"{sorted(values)[len(values) // 2]:.1f} |")
    return 0


if __name__ == "__main__":
    run_cli(main)
