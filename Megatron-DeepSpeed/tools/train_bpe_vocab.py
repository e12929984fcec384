"""Train a GPT-2 byte-level BPE vocabulary (vocab.json + merges.txt) from a JSONL corpus.

    python tools/train_bpe_vocab.py --input 'data/*.jsonl.gz' --vocab-size 8192 --output-dir data/bpe

The corpus is streamed: documents go to the trainer as they are read, so it never sits in memory whole.
The output is used with --tokenizer-type GPT2BPETokenizer --vocab-file DIR/vocab.json --merge-file DIR/merges.txt.
"""
import argparse
import glob
import gzip
import os
import sys
import time

import orjson


from megatron.errors import InputError, run_cli
from megatron.tokenizer.bpe_training import train_bpe_vocab

PROGRESS_INTERVAL_S = 5.0


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--input", required=True,
                        help="JSONL file, glob pattern or .gz file(s); one JSON object per line")
    parser.add_argument("--json-keys", nargs="+", default=["text"],
                        help="keys whose string values are training texts (default: text)")
    parser.add_argument("--vocab-size", type=int, default=8192,
                        help="tokens in the vocabulary, including the 256 byte tokens and <|endoftext|>")
    parser.add_argument("--output-dir", required=True, help="where vocab.json and merges.txt are written")
    return parser.parse_args(argv)


def input_paths(pattern):
    """The files --input names: itself if it exists, else the sorted matches of it as a glob."""
    if os.path.isfile(pattern):
        return [pattern]
    paths = sorted(path for path in glob.glob(pattern, recursive=True) if os.path.isfile(path))
    if not paths:
        raise InputError(f"--input {pattern}: no such file and no file matches it as a glob pattern")
    return paths


def read_texts(paths, json_keys, progress):
    """Yield the value of every key in `json_keys` of every JSON line of `paths`, in order."""
    for path in paths:
        try:
            yield from _texts_of_file(path, json_keys, progress)
        except (OSError, EOFError) as err:  # unreadable, or a broken/truncated .gz
            raise InputError(f"--input {path}: cannot read it ({err}); pass JSONL files, plain or gzip-compressed "
                             f"with a .gz name") from None
    progress.report()
    print("computing merges", file=sys.stderr, flush=True)


def _texts_of_file(path, json_keys, progress):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as lines:
        for line_number, line in enumerate(lines, start=1):
            if line.strip():
                yield from _texts_of_line(line, json_keys, f"{path}:{line_number}")
                progress.count(len(line))


def _texts_of_line(line, json_keys, where):
    try:
        document = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise InputError(f"{where}: not valid JSON ({err}); each line must be one JSON object") from None
    if not isinstance(document, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(document).__name__}; each line must be "
                         f"one JSON object with the keys {', '.join(json_keys)}")
    for key in json_keys:
        if key not in document:
            raise InputError(f"{where}: key {key!r} is missing; pick the text keys with --json-keys")
        text = document[key]
        if not isinstance(text, str):
            raise InputError(f"{where}: key {key!r} is not a string (got {type(text).__name__}); "
                             f"pick the text keys with --json-keys")
        yield text


class Progress:
    """Documents and bytes read so far, reported to stderr every few seconds."""

    def __init__(self):
        self.documents = 0
        self.bytes = 0
        self._started = time.monotonic()
        self._last_report = self._started

    def count(self, line_bytes):
        self.documents += 1
        self.bytes += line_bytes
        now = time.monotonic()
        if now - self._last_report >= PROGRESS_INTERVAL_S:
            self._last_report = now
            self.report()

    def report(self):
        elapsed = time.monotonic() - self._started
        print(f"read {self.documents} documents, {self.bytes / 1e6:.1f} MB in {elapsed:.0f} s",
              file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    paths = input_paths(args.input)
    print(f"training a {args.vocab_size}-token byte-level BPE on {len(paths)} file(s)", file=sys.stderr)
    progress = Progress()
    texts = read_texts(paths, args.json_keys, progress)
    vocab_path, merges_path = train_bpe_vocab(texts, args.vocab_size, args.output_dir)
    print(f"wrote {vocab_path} and {merges_path}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
