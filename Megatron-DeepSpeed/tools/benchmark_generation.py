"""Generation throughput: our decoding with the KV cache, without it (whole sequence recomputed each step), and
transformers' GPT2LMHeadModel.generate on the same (random) weights, greedy, batch 1 and batch 8.

Every run generates exactly --new-tokens tokens after a --prompt-tokens prompt (no end-of-document stop), so
the three do the same work. Printed: tokens/s (new tokens of all rows / wall time; the best of --rounds rounds
that alternate the three, after a warm-up) side by side, and ms per token when generating 1x and 4x as many
tokens: with the cache the per-token cost stays nearly flat, without it it grows with the length.

  python tools/benchmark_generation.py [--layers 4 --hidden 384 --heads 6 --vocab 8192 --new-tokens 32]
"""
import argparse
import time

import torch

from megatron import device
from megatron.families.gpt2.hf_adapter import hf_config, to_hf_tensors
from megatron.errors import InputError, run_cli
from megatron.inference.generation import generate_batch
from megatron.inference.sampling import SamplingParams
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.gpt_config import model_config_of
from megatron.model.kernels import select_kernels

GREEDY = SamplingParams()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5, help="Alternating rounds; the best of each is reported.")
    parser.add_argument("--bf16", action="store_true", help="Run all three in bfloat16 (default fp32).")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice).")
    return parser.parse_args(argv)


def build_models(args, target: torch.device, dtype: torch.dtype):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise InputError("the comparison needs transformers: pip install -r Megatron-DeepSpeed/tests/requirements.txt")\
            from None
    positions = args.prompt_tokens + 4 * args.new_tokens
    config = GPTConfig(vocab_size=args.vocab, max_position_embeddings=positions, num_layers=args.layers,
                       hidden_size=args.hidden, num_attention_heads=args.heads, hidden_dropout=0.0,
                       attention_dropout=0.0, kernels=select_kernels(device.device_name()))
    ours = GPTModel(config).eval()
    theirs = GPT2LMHeadModel._from_config(GPT2Config(**hf_config(model_config_of(config), args.vocab, dtype)),
                                          attn_implementation="sdpa")
    missing, _ = theirs.load_state_dict(dict(to_hf_tensors(ours.state_dict(), config, args.vocab)), strict=False)
    assert missing == ["lm_head.weight"]  # tied to the word embedding
    theirs.tie_weights()
    return ours.to(target, dtype), theirs.to(target, dtype).eval()


def best_seconds(runs: dict, rounds: int, warm_up: bool = True) -> dict:
    """The shortest wall time of each run over `rounds` rounds, each taking the runs in turn: on a shared
    machine the best of alternating rounds is the least disturbed figure, and every run sees the same load."""
    if warm_up:
        for run in runs.values():
            run()
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            device.synchronize()
            started = time.perf_counter()
            run()
            device.synchronize()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def runners(ours, theirs, prompts: torch.Tensor, new_tokens: int, vocab: int):
    rows = prompts.tolist()

    def ours_with(cache: bool):
        return lambda: generate_batch(ours, rows, new_tokens, GREEDY, [None] * len(rows), None, vocab,
                                      use_kv_cache=cache)

    def transformers_generate():
        with torch.no_grad():
            theirs.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0)

    return {"KV cache": ours_with(True), "no cache": ours_with(False), "transformers": transformers_generate}


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = device.current_device()
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    torch.manual_seed(0)
    ours, theirs = build_models(args, target, dtype)
    print(f"device {target}, {torch.get_num_threads()} threads, {dtype}; model: {args.layers} layers, hidden "
          f"{args.hidden}, {args.heads} heads, vocab {args.vocab}; prompt {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens, greedy", flush=True)
    print(f"{'batch':>5} | {'KV cache tok/s':>14} | {'no cache tok/s':>14} | {'transformers tok/s':>18} | "
          f"{'cache / transformers':>20}", flush=True)
    for batch in args.batch_sizes:
        prompts = torch.randint(0, args.vocab, (batch, args.prompt_tokens), device=target)
        seconds = best_seconds(runners(ours, theirs, prompts, args.new_tokens, args.vocab), args.rounds)
        rates = {name: batch * args.new_tokens / value for name, value in seconds.items()}
        print(f"{batch:>5} | {rates['KV cache']:>14.1f} | {rates['no cache']:>14.1f} | "
              f"{rates['transformers']:>18.1f} | {rates['KV cache'] / rates['transformers']:>19.2f}x", flush=True)
    print("\nms per new token, batch 1, by generation length:", flush=True)
    prompts = torch.randint(0, args.vocab, (1, args.prompt_tokens), device=target)
    for length in (args.new_tokens, 4 * args.new_tokens):  # the runs above warmed everything up
        seconds = best_seconds(runners(ours, theirs, prompts, length, args.vocab), args.rounds, warm_up=False)
        print(f"  {length:>4} tokens: " + ", ".join(f"{name} {1000 * value / length:.2f}"
                                                    for name, value in seconds.items()), flush=True)


if __name__ == "__main__":
    run_cli(main)
