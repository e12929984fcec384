"""Generate text with a trained GPT, launched like training:

    torchrun --nproc_per_node 4 tools/generate_text.py --load checkpoints/gpt --tensor-model-parallel-size 2 \
        --prompt "Once upon a time" --prompt-file prompts.jsonl --max-new-tokens 64 --greedy --output-json out.jsonl

Each tensor-parallel group holds the whole model (its heads and vocabulary split as in training); the groups
share the prompts. Decoding is batched (--micro-batch-size prompts at a time) with a KV cache (--no-kv-cache
recomputes the whole sequence every step) and stops at the end-of-document token or --max-new-tokens. Rank 0
prints every prompt with its continuation; --output-json writes one JSON object per prompt.
"""
import argparse
import json
import os

from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.trust import trusting
from megatron.config.flags import inference as inference_flags
from megatron.config.flags.common import OneLineErrorParser
from megatron.errors import InputError, run_cli
from megatron.files.atomic import require_writable_place, write_text_atomically
from megatron.inference.command_line import load_from_flags, tokenizer_from_flags
from megatron.inference.distributed import generate_for_prompts
from megatron.inference.prompts import gather_prompts, tokenize_prompts
from megatron.inference.sampling import SamplingParams


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    inference_flags.add_flags(parser)
    group = parser.add_argument_group("prompts and decoding")
    group.add_argument("--prompt", action="append", default=[], help="A prompt (repeatable).")
    group.add_argument("--prompt-file", help='Prompts, one per line, or JSONL lines {"text": ...}.')
    group.add_argument("--max-new-tokens", type=int, default=64, help="Tokens to generate per prompt at most.")
    group.add_argument("--greedy", action="store_true", help="Always take the most likely token.")
    group.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature.")
    group.add_argument("--top-k", type=int, default=0, help="Sample among the k most likely tokens (0: all).")
    group.add_argument("--top-p", type=float, default=1.0, help="Sample among the most likely tokens holding this "
                                                               "probability mass (1: all).")
    group.add_argument("--seed", type=int, default=1234, help="Sampling seed (with the prompt's index).")
    group.add_argument("--no-kv-cache", action="store_true", help="Recompute the whole sequence at every step.")
    group.add_argument("--output-json", help="Write one JSON object per prompt here (JSONL).")
    group.add_argument("--force", action="store_true", help="Overwrite an existing --output-json file.")
    return parser.parse_args(argv)


def main(argv=None):
    from deepspeed_npu import activate  # first: on an Ascend host it selects the NPU before DeepSpeed loads
    npu = activate()
    args = parse_args(argv)
    with trusting(args.trust_checkpoint):
        return run(args, npu)


def run(args, npu):
    if args.output_json and os.path.exists(args.output_json) and not args.force:
        raise InputError(f"--output-json {args.output_json} exists; pass --force to overwrite it or choose another "
                         "path")
    if args.output_json:
        require_writable_place("--output-json", args.output_json)
    texts = gather_prompts(args.prompt, args.prompt_file)
    params = SamplingParams(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            seed=args.seed)
    tokenizer, recorded = tokenizer_from_flags(args)
    max_positions = RecordedFlags.of(recorded).max_position_embeddings
    prompts = tokenize_prompts(tokenizer, texts, args.max_new_tokens, max_positions)
    loaded = load_from_flags(args, tokenizer, npu.kernels)
    results = generate_for_prompts(loaded.model, prompts, batch_size=args.micro_batch_size,
                                   max_new_tokens=args.max_new_tokens, params=params, eod=tokenizer.eod,
                                   vocab_size=tokenizer.vocab_size, use_kv_cache=not args.no_kv_cache,
                                   tensor_parallel_group=loaded.tensor_parallel_group, **loaded.data_parallel())
    records, shown = [], []
    for text, result in zip(texts, results):
        new_ids = [i for i in result.generated_ids if i != tokenizer.eod]
        records.append({"prompt": text, "prompt_ids": result.prompt_ids, "generated_ids": result.generated_ids,
                        "text": tokenizer.detokenize(new_ids), "tokens_per_second": round(result.tokens_per_second, 2)})
        shown.append(tokenizer.detokenize(result.prompt_ids + new_ids))
    if loaded.parallel.rank == 0:
        for whole in shown:
            print(f"{'-' * 80}\n{whole}", flush=True)
        if args.output_json:
            write_text_atomically(args.output_json, "".join(json.dumps(record) + "\n" for record in records))
    return records


if __name__ == "__main__":
    run_cli(main)
