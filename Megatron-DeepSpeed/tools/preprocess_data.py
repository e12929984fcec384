"""Turn JSONL text into Megatron `.bin/.idx` files (flags of Megatron-LM's tools/preprocess_data.py).

Example:
  python tools/preprocess_data.py --input corpus.jsonl --output-prefix data/my-gpt2 \
      --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --tokenizer-type GPT2BPETokenizer \
      --append-eod --workers 2
writes data/my-gpt2_text_document.bin and .idx.
"""
import argparse
import os


from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.errors import InputError, run_cli
from megatron.tokenizer import TOKENIZER_TYPES, build_tokenizer


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True, help="JSONL file, a .gz of one, or a glob (files in sorted order)")
    group.add_argument("--json-keys", nargs="+", default=["text"], help="keys to extract from each JSON line")
    group.add_argument("--split-sentences", action="store_true", help="one item per sentence")
    group.add_argument("--keep-newlines", action="store_true",
                       help="with --split-sentences, keep newlines between sentences")
    group.add_argument("--lang", default="english", choices=["english"], help="language of sentence splitting")
    group.add_argument("--skip-malformed-lines", action="store_true",
                       help="skip (and count) lines that are not valid JSON objects instead of stopping")

    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES)
    group.add_argument("--vocab-file", help="GPT-2 vocab.json")
    group.add_argument("--merge-file", help="GPT-2 merges.txt")
    group.add_argument("--tokenizer-model", help="SentencePiece .model file, or for HFTokenizer a Hugging Face "
                                                 "tokenizer directory or its tokenizer.json")
    group.add_argument("--vocab-size", type=int, help="vocabulary size of the NullTokenizer")
    group.add_argument("--append-eod", action="store_true", help="append the end-of-document token to each document")

    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True, help="path prefix of the .bin/.idx files, without suffix")
    group.add_argument("--dataset-impl", default="mmap", choices=["mmap"],
                       help="only Megatron's mmap format is written")

    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    group.add_argument("--partitions", type=int, default=1,
                       help="accepted for compatibility: the input is streamed once whatever the value, and the "
                            "output is identical; use --workers for parallelism")
    group.add_argument("--log-interval", type=int, default=1000, help="report progress every N documents")
    group.add_argument("--allow-empty", action="store_true",
                       help="write the dataset even if the input holds no text (refused otherwise)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.partitions < 1:
        raise InputError(f"--partitions {args.partitions}: must be at least 1")
    output_dir = os.path.dirname(os.path.abspath(args.output_prefix))
    if not os.path.isdir(output_dir):
        raise InputError(f"--output-prefix {args.output_prefix!r}: directory {output_dir!r} does not exist; "
                         f"create it first")
    tokenizer = build_tokenizer(args.tokenizer_type, vocab_file=args.vocab_file, merge_file=args.merge_file,
                                tokenizer_model=args.tokenizer_model, vocab_size=args.vocab_size)
    options = PreprocessOptions(
        input_pattern=args.input, output_prefix=args.output_prefix, json_keys=tuple(args.json_keys),
        split_sentences=args.split_sentences, keep_newlines=args.keep_newlines, append_eod=args.append_eod,
        workers=args.workers, log_interval=args.log_interval, skip_malformed_lines=args.skip_malformed_lines,
        allow_empty=args.allow_empty)
    preprocess(options, tokenizer)


if __name__ == "__main__":
    run_cli(main)
