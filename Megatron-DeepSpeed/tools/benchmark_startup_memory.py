"""Peak host memory (RSS) per rank and seconds to get the model ready at start-up: building it for training on
the plain engine (--no-pipeline-parallel), whose ranks once built the whole model before keeping their
tensor-parallel shard; or, with --load, loading a checkpoint for generation or zero-shot evaluation
(megatron/inference/loading.py), where every rank once read the whole checkpoint.

Each tensor-parallel size runs as its own torchrun job (gloo, fp32 weights; the preset's shape with GPT-2's
vocabulary, or the checkpoint's); each rank reports its peak RSS (the whole process: Python, torch and DeepSpeed
included), the RSS before the model was built or read, the seconds, and its shard's size. With --compare-root
the same runs use another checkout's `megatron` (e.g. a `git worktree` of an older commit), one after the other.

  PYTHONPATH=Megatron-DeepSpeed python Megatron-DeepSpeed/tools/benchmark_startup_memory.py \\
      [--model-size 1.3B | --load CKPT] [--tensor 1 2] [--compare-root /path/to/old/Megatron-DeepSpeed]
"""
import argparse
import os
import sys

from megatron.config.presets import preset_names
from megatron.errors import run_cli
from megatron.reports.worker_runs import report, run_with_root

THIS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
RESULT_PREFIX = "startup-memory: "


def _measured(make_model) -> dict:
    """Peak RSS, RSS before, seconds and parameter bytes of make_model() on this rank."""
    import resource
    import time

    import psutil

    before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    model = make_model()
    seconds = time.perf_counter() - start
    return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss_before": before,
            "seconds": seconds, "shard": sum(p.numel() * p.element_size() for p in model.parameters())}


def parallel_state_of(tensor: int):
    import deepspeed

    from megatron.parallel_state import ParallelState

    deepspeed.init_distributed("gloo", verbose=False)
    return ParallelState(tensor_parallel_size=tensor, pipeline_parallel_size=1)


def build_on_this_rank(model_size: str, tensor: int) -> dict:
    """Build this rank's module as pretrain_gpt.py would (plain engine) and measure it."""
    from megatron.config.job import ParallelConfig
    from megatron.config.presets import get_preset
    from megatron.model.gpt import GPTConfig
    from megatron.model.provider import model_provider
    from megatron.tensor_parallel import tensor_parallel_rng_tracker
    from megatron.tokenizer import vocab_size_with_padding

    parallel = parallel_state_of(tensor)
    preset = get_preset(model_size)
    parallel_config = ParallelConfig(tensor=tensor, pipeline=1, data=1, world_size=tensor, sequence_parallel=False,
                                     pipeline_engine=False, zero_stage=0, distributed_backend="gloo",
                                     zero_reduce_scatter=False, zero_contigious_gradients=False,
                                     zero_reduce_bucket_size=0, zero_allgather_bucket_size=0, remote_device="none",
                                     use_pin_memory=False)
    config = GPTConfig(vocab_size=vocab_size_with_padding(50257, 128, tensor),
                       max_position_embeddings=preset["seq_length"], num_layers=preset["num_layers"],
                       hidden_size=preset["hidden_size"], num_attention_heads=preset["num_attention_heads"])
    tracker = tensor_parallel_rng_tracker(1234, parallel.tp_rank)
    return {"rank": parallel.tp_rank,
            **_measured(lambda: model_provider(config, parallel_config, parallel, tracker))}


def load_on_this_rank(load_dir: str, tensor: int) -> dict:
    """Load this rank's part of the checkpoint as generation and zero-shot evaluation do, and measure it."""
    import torch

    from megatron.hf.conversions import unpadded_vocab_size
    from megatron.inference.loading import load_model, recorded_flags
    from megatron.model.kernels import PORTABLE_KERNELS

    parallel = parallel_state_of(tensor)
    vocab = unpadded_vocab_size(recorded_flags(load_dir))
    return {"rank": parallel.tp_rank,
            **_measured(lambda: load_model(load_dir, tokenizer_vocab_size=vocab, parallel_state=parallel,
                                           kernels=PORTABLE_KERNELS, dtype=torch.float32,
                                           device=torch.device("cpu"))[0])}


def run(root: str, what: list, tensor: int) -> list:
    """One torchrun job of `tensor` ranks with `root`'s megatron; the ranks' measurements."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={tensor}",
               os.path.abspath(__file__), "--worker", *what, "--tensor", str(tensor)]
    ranks = run_with_root(command, root, RESULT_PREFIX, {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    return sorted(ranks, key=lambda rank: rank["rank"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", choices=preset_names(), default="1.3B")
    parser.add_argument("--load", help="measure loading this checkpoint for generation instead")
    parser.add_argument("--tensor", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--compare-root", help="another checkout's Megatron-DeepSpeed directory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        measured = (load_on_this_rank(args.load, args.tensor[0]) if args.load else
                    build_on_this_rank(args.model_size, args.tensor[0]))
        report(RESULT_PREFIX, measured)
        return 0
    roots = [("this checkout", THIS_ROOT)] + ([("compare root", args.compare_root)] if args.compare_root else [])
    what = ["--load", os.path.abspath(args.load)] if args.load else ["--model-size", args.model_size]
    print(f"loading {args.load} for generation" if args.load else f"{args.model_size}, plain engine, fp32 weights",
          "; GiB per rank", sep="")
    print("| code | TP | rank | peak RSS | RSS before | shard | seconds |")
    print("|---|---|---|---|---|---|---|")
    for tensor in args.tensor:
        for label, root in roots:
            for rank in run(root, what, tensor):
                print(f"| {label} | {tensor} | {rank['rank']} | {rank['peak_rss'] / GIB:.2f} | "
                      f"{rank['rss_before'] / GIB:.2f} | {rank['shard'] / GIB:.2f} | {rank['seconds']:.1f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
