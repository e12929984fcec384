"""Whole-process preprocessing throughput (input MB/s) on a corpus of at least 50 MB.

The corpus is the embedded demo corpus (standard-library docstrings) repeated with its documents in a
different order each round until it reaches --corpus-mb; the vocab is a GPT-2-style BPE trained on the
demo corpus. `tools/preprocess_data.py` then runs as its own process, timed from start to exit, as a
user would run it. Megatron's Python pipeline does about 3 MB/s with 2 workers on a 2-core machine.

  python tools/benchmark_preprocess.py --workers 2 [--corpus-mb 60] [--work-dir /tmp/bench]
"""
import argparse
import os
import random
import subprocess
import sys
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))

from megatron.data.demo_corpus import iter_stdlib_docstrings
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.tokenizer.bpe_training import train_bpe_vocab

MEGATRON_REFERENCE_MB_PER_S = 3.0


def build_corpus(path: str, target_bytes: int, seed: int = 1234) -> int:
    import orjson
    lines = [orjson.dumps({"text": text}) + b"\n" for text in iter_stdlib_docstrings()]
    rng = random.Random(seed)
    written = 0
    with open(path, "wb") as out:
        while written < target_bytes:
            rng.shuffle(lines)
            for line in lines:
                out.write(line)
                written += len(line)
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--corpus-mb", type=float, default=60.0)
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--work-dir", default="/tmp/megatron-preprocess-benchmark")
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)

    corpus = os.path.join(args.work_dir, "corpus.jsonl")
    target = int(args.corpus_mb * 1e6)
    if not os.path.exists(corpus) or os.path.getsize(corpus) < target:
        print(f"building a {args.corpus_mb:.0f} MB corpus ...", flush=True)
        build_corpus(corpus, target)
    tokenizer_dir = os.path.join(args.work_dir, f"bpe{args.vocab_size}")
    if not os.path.exists(os.path.join(tokenizer_dir, "merges.txt")):
        print(f"training a {args.vocab_size}-token BPE vocab on the demo corpus ...", flush=True)
        train_bpe_vocab(iter_stdlib_docstrings(), args.vocab_size, tokenizer_dir)

    prefix = os.path.join(args.work_dir, "out")
    command = [sys.executable, os.path.join(TOOLS, "preprocess_data.py"), "--input", corpus,
               "--output-prefix", prefix, "--tokenizer-type", "GPT2BPETokenizer",
               "--vocab-file", os.path.join(tokenizer_dir, "vocab.json"),
               "--merge-file", os.path.join(tokenizer_dir, "merges.txt"),
               "--append-eod", "--workers", str(args.workers), "--log-interval", "100000"]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - start

    size_mb = os.path.getsize(corpus) / 1e6
    dataset = MMapIndexedDataset(f"{prefix}_text_document")
    tokens = int(dataset.sizes.sum())
    rate = size_mb / seconds
    print(f"preprocess_data.py, {args.workers} workers, {os.cpu_count()} CPUs: {size_mb:.1f} MB, "
          f"{len(dataset.doc_idx) - 1} documents, {tokens / 1e6:.1f}M tokens in {seconds:.2f} s "
          f"(whole process)")
    print(f"throughput: {rate:.1f} MB/s, {tokens / seconds / 1e6:.2f}M tokens/s; "
          f"{rate / MEGATRON_REFERENCE_MB_PER_S:.1f}x Megatron's ~{MEGATRON_REFERENCE_MB_PER_S:.0f} MB/s")


if __name__ == "__main__":
    main()
