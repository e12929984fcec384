"""JSONL text → Megatron `.bin/.idx` token files, streamed, with parsing, tokenizing and writing overlapped.

The input is read in batches of lines; worker processes parse and tokenize whole batches (processes, not
threads: JSON parsing and per-document bookkeeping hold the GIL for a fifth of the time), while the main
process appends finished batches to the output in input order.
At most a few batches are in flight, so memory stays bounded however large the corpus is. The output is
the same for any number of workers: Megatron-LM's tool would write the same bytes.
"""
import glob
import gzip
import os
import signal
import sys
import threading
import time
from collections import deque
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import orjson

from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder, best_fitting_dtype
from megatron.data.sentence_splitter import split_sentences
from megatron.errors import InputError

BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class PreprocessOptions:
    input_pattern: str
    output_prefix: str
    json_keys: tuple[str, ...] = ("text",)
    split_sentences: bool = False
    keep_newlines: bool = False
    append_eod: bool = False
    workers: int = 1
    log_interval: int = 1000
    skip_malformed_lines: bool = False
    batch_bytes: int = BATCH_BYTES  # input read per batch: larger batches, fewer hand-offs, more memory
    allow_empty: bool = False  # write a dataset even when the input holds no text


@dataclass
class LineBatch:
    path: str
    first_line: int  # 1-based number of lines[0] in its file
    lines: list[bytes]


@dataclass
class EncodedBatch:
    """Per JSON key: the tokens, the size of each item, and how many items each document has."""
    tokens: dict[str, np.ndarray]
    item_sizes: dict[str, np.ndarray]
    items_per_document: dict[str, np.ndarray]
    documents: int
    input_bytes: int
    skipped_lines: int


def output_prefix_for(options: PreprocessOptions, key: str) -> str:
    level = "sentence" if options.split_sentences else "document"
    return f"{options.output_prefix}_{key}_{level}"


def resolve_inputs(pattern: str) -> list[str]:
    """The input files (a path, or a glob taken in sorted order), each checked to be readable."""
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    if not paths:
        raise InputError(f"--input {pattern!r} matches no file; give a JSONL file, a .gz of one, or a glob")
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"--input {path!r} does not exist or is not a file; give a JSONL file (or .gz)")
        if not os.access(path, os.R_OK):
            raise InputError(f"--input {path!r} is not readable (permission denied)")
    return paths


def iter_line_batches(paths: list[str], batch_bytes: int = BATCH_BYTES) -> Iterator[LineBatch]:
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        line_number = 1
        with opener(path, "rb") as stream:
            while lines := stream.readlines(batch_bytes):
                yield LineBatch(path, line_number, lines)
                line_number += len(lines)


class BatchEncoder:
    """Parses and tokenizes one batch of JSONL lines."""

    def __init__(self, tokenizer, options: PreprocessOptions):
        self.tokenizer = tokenizer
        self.options = options
        self.dtype = best_fitting_dtype(tokenizer.vocab_size)  # the output's: batches travel at its size

    def __call__(self, batch: LineBatch) -> EncodedBatch:
        documents, skipped = self._parse(batch)
        encoded = EncodedBatch({}, {}, {}, len(documents), sum(map(len, batch.lines)), skipped)
        for key in self.options.json_keys:
            pieces, pieces_per_document = self._pieces(documents, key)
            tokens, sizes = self.tokenizer.tokenize_batch(pieces)
            tokens, sizes, items_per_document = self._drop_empty_and_append_eod(
                np.asarray(tokens), np.asarray(sizes, dtype=np.int64), pieces_per_document)
            encoded.tokens[key] = tokens
            encoded.item_sizes[key] = sizes
            encoded.items_per_document[key] = items_per_document
        return encoded

    def _parse(self, batch: LineBatch) -> tuple[list[tuple[str, int, dict]], int]:
        documents, skipped = [], 0
        for offset, line in enumerate(batch.lines):
            if not line.strip():
                continue
            line_number = batch.first_line + offset
            try:
                document = orjson.loads(line)
                if not isinstance(document, dict):
                    raise orjson.JSONDecodeError("a line must hold one JSON object", line.decode(errors="replace"), 0)
            except orjson.JSONDecodeError as err:
                if self.options.skip_malformed_lines:
                    skipped += 1
                    continue
                raise InputError(
                    f"{batch.path}:{line_number}: not a valid JSON object ({err}); fix or remove the line, "
                    f"or pass --skip-malformed-lines to skip and count such lines") from None
            documents.append((batch.path, line_number, document))
        return documents, skipped

    def _pieces(self, documents, key: str) -> tuple[list[str], np.ndarray]:
        """The texts to tokenize for `key` (sentences when splitting) and how many belong to each document."""
        pieces, counts = [], np.empty(len(documents), dtype=np.int64)
        for index, (path, line_number, document) in enumerate(documents):
            if key not in document:
                raise InputError(
                    f"{path}:{line_number}: the JSON object has no key {key!r} (its keys: "
                    f"{', '.join(map(repr, document)) or 'none'}); choose the text keys with --json-keys")
            value = document[key]
            if isinstance(value, str):
                texts = (split_sentences(value, self.options.keep_newlines)
                         if self.options.split_sentences else [value])
            elif isinstance(value, list) and all(isinstance(text, str) for text in value):
                texts = value  # already split into sentences, as Megatron accepts
            else:
                raise InputError(f"{path}:{line_number}: key {key!r} holds a {type(value).__name__}, "
                                 f"expected a string (or a list of sentence strings)")
            pieces.extend(texts)
            counts[index] = len(texts)
        return pieces, counts

    def _drop_empty_and_append_eod(self, tokens, sizes, pieces_per_document):
        """Megatron's rules: a piece that tokenizes to nothing is no item; with --append-eod the EOD
        token ends every non-empty document and counts in its last item's size. The tokens come back in the
        output's dtype (one copy, the ids of a long document are its largest array)."""
        document_of_piece = np.repeat(np.arange(len(pieces_per_document)), pieces_per_document)
        kept = sizes > 0
        sizes = sizes[kept]
        items_per_document = np.bincount(document_of_piece[kept], minlength=len(pieces_per_document))
        ends = np.empty(0, dtype=np.int64)
        if self.options.append_eod and len(sizes):
            last_items = np.cumsum(items_per_document)[items_per_document > 0] - 1
            ends = np.cumsum(sizes)[last_items]
            sizes[last_items] += 1
        return self._with_eods(tokens, ends), sizes, items_per_document

    def _with_eods(self, tokens: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """`tokens` with the EOD token inserted before each offset of `ends`, in the output's dtype where every
        id fits it (otherwise as they are: the dataset builder names the id that does not)."""
        fits = not tokens.size or (tokens.min() >= 0 and tokens.max() <= np.iinfo(self.dtype).max)
        result = np.empty(tokens.size + ends.size, dtype=self.dtype if fits else tokens.dtype)
        eods = ends + np.arange(ends.size)
        is_token = np.ones(result.size, dtype=bool)
        is_token[eods] = False
        result[is_token] = tokens
        result[eods] = self.tokenizer.eod
        return result


_worker_encoder = None  # each worker process's BatchEncoder, set once by _start_worker


def _start_worker(encoder: BatchEncoder) -> None:
    """A worker ignores Ctrl-C (the main process stops the pool and removes its output) and ends when the
    main process is gone, instead of waiting for batches forever holding its memory."""
    global _worker_encoder
    _worker_encoder = encoder
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def _encode_in_worker(batch: LineBatch) -> EncodedBatch:
    return _worker_encoder(batch)


def preprocess(options: PreprocessOptions, tokenizer, log: Callable[[str], None] = None) -> list[str]:
    """Run the whole conversion; returns the output prefixes written (one per JSON key)."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    if options.workers < 1:
        raise InputError(f"--workers {options.workers}: must be at least 1")
    paths = resolve_inputs(options.input_pattern)
    dtype = best_fitting_dtype(tokenizer.vocab_size)
    encode = BatchEncoder(tokenizer, options)
    progress = Progress(options.log_interval, log)
    prefixes = {key: output_prefix_for(options, key) for key in options.json_keys}
    with ExitStack() as stack:
        builders = {key: stack.enter_context(MMapIndexedDatasetBuilder(prefix, dtype))
                    for key, prefix in prefixes.items()}
        # fork: the workers inherit the tokenizer instead of loading it again.
        pool = stack.enter_context(ProcessPoolExecutor(options.workers, multiprocessing.get_context("fork"),
                                                       initializer=_start_worker, initargs=(encode,)))
        stack.callback(pool.shutdown, wait=True, cancel_futures=True)
        in_flight = deque()
        for batch in iter_line_batches(paths, options.batch_bytes):
            in_flight.append(pool.submit(_encode_in_worker, batch))
            if len(in_flight) > 2 * options.workers:
                _write(in_flight.popleft().result(), builders, progress)
        while in_flight:
            _write(in_flight.popleft().result(), builders, progress)
        if not progress.tokens and not options.allow_empty:  # raised inside: the builders discard their output
            raise InputError(f"--input {options.input_pattern}: no text to write ({progress.documents} documents, "
                             f"0 tokens for --json-keys {' '.join(options.json_keys)}), so nothing was written and "
                             f"any existing output is kept; check the input and --json-keys, or pass --allow-empty")
    progress.finish([f"{prefix}.bin/.idx" for prefix in prefixes.values()])
    return list(prefixes.values())


def _write(encoded: EncodedBatch, builders, progress: "Progress") -> None:
    for key, builder in builders.items():
        builder.add_documents(encoded.tokens[key], encoded.item_sizes[key], encoded.items_per_document[key])
    progress.update(encoded)


class Progress:
    """Megatron-style progress lines: documents, documents/s and input MB/s."""

    def __init__(self, interval: int, log: Callable[[str], None]):
        self.interval, self.log = interval, log
        self.start = time.perf_counter()
        self.documents = self.input_bytes = self.skipped = self.tokens = 0
        self.next_report = interval

    def update(self, encoded: EncodedBatch) -> None:
        self.documents += encoded.documents
        self.input_bytes += encoded.input_bytes
        self.skipped += encoded.skipped_lines
        self.tokens += sum(len(tokens) for tokens in encoded.tokens.values())
        if self.interval > 0 and self.documents >= self.next_report:
            self.next_report = (self.documents // self.interval + 1) * self.interval
            self.log(self._line("Processed"))

    def finish(self, outputs: list[str]) -> None:
        self.log(self._line("Done:"))
        if self.skipped:
            self.log(f"Skipped {self.skipped} malformed lines (--skip-malformed-lines).")
        self.log("Wrote " + ", ".join(outputs))

    def _line(self, verb: str) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return (f"{verb} {self.documents} documents, {self.tokens} tokens "
                f"({self.documents / elapsed:.1f} docs/s, {self.input_bytes / elapsed / 1e6:.2f} MB/s).")
