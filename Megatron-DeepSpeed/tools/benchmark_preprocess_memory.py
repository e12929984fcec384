"""Peak memory of preprocessing per byte of its largest document.

One JSONL line whose "text" holds --field-mb MB of prose (the demo corpus' docstrings, one after another) goes
through tools/preprocess_data.py as its own process, with a GPT-2-style BPE vocab trained on the demo corpus.
The resident memory of the whole process tree (the main process and its workers, summed) is sampled every
10 ms; the same run on a document a fifth as large gives the rest: prints both peaks and the memory each
further byte of the document costs, (peak - smaller peak) / (size - smaller size).

  python tools/benchmark_preprocess_memory.py [--field-mb 20] [--work-dir /tmp/bench-memory]
"""
import argparse
import os
import subprocess
import sys
import time

import psutil

TOOLS = os.path.dirname(os.path.abspath(__file__))

from megatron.data.demo_corpus import iter_stdlib_docstrings
from megatron.tokenizer.bpe_training import train_bpe_vocab


def write_document(path: str, field_bytes: int) -> int:
    """One JSONL line of about `field_bytes` bytes of text; returns the text's UTF-8 size."""
    import orjson
    texts = list(iter_stdlib_docstrings())
    pieces, size = [], 0
    while size < field_bytes:
        for text in texts:
            pieces.append(text)
            size += len(text.encode("utf-8")) + 2
            if size >= field_bytes:
                break
    text = "\n\n".join(pieces)
    with open(path, "wb") as out:
        out.write(orjson.dumps({"text": text}) + b"\n")
    return len(text.encode("utf-8"))


def peak_tree_rss(command) -> int:
    """Run `command`; the largest sum of resident memory over it and its descendants seen while it ran."""
    process = psutil.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while process.poll() is None:
        total = 0
        try:
            for member in [process, *process.children(recursive=True)]:
                total += member.memory_info().rss
        except psutil.Error:  # a member ended between listing and reading: count the next sample
            pass
        peak = max(peak, total)
        time.sleep(0.01)
    if process.returncode:
        raise SystemExit(f"preprocess_data.py failed: {process.stderr.read().decode()[-2000:]}")
    return peak


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--field-mb", type=float, default=20.0)
    parser.add_argument("--vocab-size", type=int, default=5000)
    parser.add_argument("--work-dir", default="/tmp/megatron-preprocess-memory")
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    tokenizer_dir = os.path.join(args.work_dir, f"bpe{args.vocab_size}")
    if not os.path.exists(os.path.join(tokenizer_dir, "merges.txt")):
        print(f"training a {args.vocab_size}-token BPE vocab on the demo corpus ...", flush=True)
        train_bpe_vocab(iter_stdlib_docstrings(), args.vocab_size, tokenizer_dir)

    def run(name: str, field_bytes: int) -> tuple[int, int]:
        corpus = os.path.join(args.work_dir, f"{name}.jsonl")
        size = write_document(corpus, field_bytes)
        command = [sys.executable, os.path.join(TOOLS, "preprocess_data.py"), "--input", corpus,
                   "--output-prefix", os.path.join(args.work_dir, name), "--tokenizer-type", "GPT2BPETokenizer",
                   "--vocab-file", os.path.join(tokenizer_dir, "vocab.json"),
                   "--merge-file", os.path.join(tokenizer_dir, "merges.txt"), "--append-eod", "--workers", "1"]
        return size, peak_tree_rss(command)

    small_size, small_peak = run("small", int(args.field_mb * 1e6 / 5))
    size, peak = run("large", int(args.field_mb * 1e6))
    print(f"preprocess_data.py, one document of {size / 1e6:.1f} MB: peak {peak / 1e6:.0f} MB (process tree), "
          f"{small_size / 1e6:.1f} MB: {small_peak / 1e6:.0f} MB; {(peak - small_peak) / (size - small_size):.1f} bytes "
          f"of memory per byte of the largest document")


if __name__ == "__main__":
    main()
