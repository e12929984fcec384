"""Tokenize fine-tuning rows once for finetune_llama.py: Alpaca JSON, prompt/completion, chat `messages` or
ShareGPT `conversations` rows (a JSON list or JSONL) -> <output-prefix>_tokens.{bin,idx} and
<output-prefix>_loss_mask.{bin,idx}, then train with --data-path <output-prefix>.

Example:
  python tools/preprocess_sft_data.py --input alpaca_data.json --output-prefix data/alpaca \\
      --tokenizer-type HFTokenizer --tokenizer-model ./Llama-2-7b-hf --seq-length 512
"""
import argparse

from megatron.data.sft_data import renderer_for
from megatron.data.sft_preprocess import preprocess_rows
from megatron.errors import run_cli
from megatron.tokenizer import TOKENIZER_TYPES, build_tokenizer


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="a JSON list of rows or a JSONL file")
    parser.add_argument("--output-prefix", required=True, help="path prefix of the two indexed datasets")
    parser.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES)
    parser.add_argument("--tokenizer-model", help="for HFTokenizer a Hugging Face tokenizer directory (its chat "
                                                  "template renders chat rows); SentencePiece's .model file")
    parser.add_argument("--vocab-file", help="GPT-2 vocab.json")
    parser.add_argument("--merge-file", help="GPT-2 merges.txt")
    parser.add_argument("--vocab-size", type=int, help="vocabulary size of the NullTokenizer")
    parser.add_argument("--seq-length", type=int, required=True, help="the training run's --seq-length")
    parser.add_argument("--overlong-examples", choices=("truncate", "drop"), default="truncate",
                        help="an example longer than --seq-length + 1 tokens: truncated (upstream's way) or dropped")
    parser.add_argument("--log-interval", type=int, default=1000, help="report progress every N rows")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    tokenizer = build_tokenizer(args.tokenizer_type, vocab_file=args.vocab_file, merge_file=args.merge_file,
                                tokenizer_model=args.tokenizer_model, vocab_size=args.vocab_size)
    return preprocess_rows(args.input, args.output_prefix, renderer_for(tokenizer), tokenizer.vocab_size,
                           args.seq_length, args.overlong_examples, args.log_interval)


if __name__ == "__main__":
    run_cli(main)
