"""Zero-shot evaluation of a trained GPT on local files (upstream Megatron's task names), launched like training:

    torchrun --nproc_per_node 2 tasks/zeroshot_gpt/evaluate.py --task WIKITEXT103 --valid-data wiki.test.tokens \
        --load checkpoints/gpt --overlapping-eval 256
    python tasks/zeroshot_gpt/evaluate.py --task LAMBADA --valid-data lambada_test.jsonl --strict-lambada --load ...

WIKITEXT103: perplexity of a WikiText file (its tokenization undone first), windows of --seq-length tokens
advancing by --overlapping-eval tokens, each scoring only the tokens it adds; reports the token-level and the
word-level ("adjusted") perplexity. LAMBADA: the fraction of passages (JSONL, {"text": ...} per line) whose last
token (with --strict-lambada: last word) the model predicts greedily. Nothing is downloaded.
"""
import argparse

from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.trust import trusting
from megatron.config.flags import inference as inference_flags
from megatron.config.flags.common import OneLineErrorParser
from megatron.errors import InputError, run_cli
from megatron.evaluation.lambada import read_lambada
from megatron.evaluation.zeroshot import accuracy_report, lambada_accuracy, perplexity_report, wikitext_perplexity
from megatron.inference.command_line import load_from_flags, tokenizer_from_flags

TASKS = ("WIKITEXT103", "LAMBADA")


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    inference_flags.add_flags(parser, seq_length_flag=False)  # --seq-length is the evaluation window here
    group = parser.add_argument_group("task")
    group.add_argument("--task", choices=TASKS, required=True)
    group.add_argument("--valid-data", required=True, help="The task's local file (WikiText text, LAMBADA JSONL).")
    group.add_argument("--seq-length", type=int, help="Window length for WIKITEXT103. Default: as trained.")
    group.add_argument("--overlapping-eval", type=int,
                       help="WIKITEXT103: tokens each window advances by (default --seq-length: no overlap).")
    group.add_argument("--strict-lambada", action="store_true", help="LAMBADA: predict the whole last word.")
    return parser.parse_args(argv)


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"--valid-data {path}: cannot read it as UTF-8 text ({err}); give a local WikiText file") \
            from None


def main(argv=None):
    from deepspeed_npu import activate  # first: on an Ascend host it selects the NPU before DeepSpeed loads
    npu = activate()
    args = parse_args(argv)
    with trusting(args.trust_checkpoint):
        return run(args, npu)


def run(args, npu):
    tokenizer, recorded = tokenizer_from_flags(args)
    max_positions = RecordedFlags.of(recorded).max_position_embeddings
    if args.task == "LAMBADA":
        examples = read_lambada(args.valid_data, tokenizer, args.strict_lambada, max_positions)
    else:
        text = read_text(args.valid_data)
        seq_length = args.seq_length or RecordedFlags.of(recorded).seq_length
        if not 1 <= seq_length <= max_positions:
            raise InputError(f"--seq-length {seq_length} must be between 1 and the model's context of {max_positions}")
    loaded = load_from_flags(args, tokenizer, npu.kernels)
    shared = dict(batch_size=args.micro_batch_size, data_parallel_group=loaded.parallel.get_data_parallel_group(),
                  **loaded.data_parallel())
    if args.task == "LAMBADA":
        result = lambada_accuracy(loaded.model, examples, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.eod,
                                  tensor_parallel_group=loaded.tensor_parallel_group, **shared)
        report = accuracy_report(args.task, result)
    else:
        result = wikitext_perplexity(loaded.model, tokenizer, text, seq_length=seq_length,
                                     overlapping_eval=args.overlapping_eval or seq_length, **shared)
        report = perplexity_report(args.task, result)
    if loaded.parallel.rank == 0:
        print(report, flush=True)
    return result


if __name__ == "__main__":
    run_cli(main)
