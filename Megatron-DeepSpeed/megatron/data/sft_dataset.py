"""Fine-tuning examples from their files, fitted to the sequence length, and served one sample per index.

Rows come from a JSON list (upstream's Alpaca file) or a JSONL file, rendered by sft_examples; or, preprocessed
once (tools/preprocess_sft_data.py), from two indexed datasets beside each other: `<prefix>_tokens` (the ids) and
`<prefix>_loss_mask` (uint8, 1 on targets), one item per example. A sample holds --seq-length + 1 tokens (inputs
and next-token labels are its two shifted views, as in pre-training): one example padded (PaddedExamples), or
with --pack-sequences several whole examples back to back (PackedExamples) with the index of the example each
token belongs to. Padding is never a target and comes after every real token, which attends only backwards, so
the pad id changes no loss: the tokenizer's pad token where it names one, else its end of document. (Upstream
main's prompt dataset takes its targets where the label differs from the pad id, so a pad id equal to EOS left
every EOS target out of the loss; its HFTokenizer's added "[PAD]" has the id after the vocabulary, which an
unpadded embedding does not hold. Neither happens here: the mask is the example's own.)
"""
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import numpy as np

from megatron.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder, best_fitting_dtype
from megatron.data.sft_examples import BadRow, Example, ExampleRenderer
from megatron.errors import InputError

_log = logging.getLogger(__name__)

OVERLONG = ("truncate", "drop")
TOKENS_SUFFIX, LOSS_MASK_SUFFIX = "_tokens", "_loss_mask"
RAW_SUFFIXES = (".json", ".jsonl")


@dataclass
class ReadReport:
    """What became of the rows: each bad or dropped one was reported in a line of its own."""
    rows: int = 0
    examples: int = 0
    bad: int = 0
    truncated: int = 0
    dropped: int = 0
    tokens: int = 0
    answer_tokens: int = 0
    lines: list = field(default_factory=list)

    def summary(self, source: str) -> str:
        return (f"{source}: {self.rows} rows -> {self.examples} examples ({self.tokens} tokens, {self.answer_tokens} "
                f"trained on); {self.bad} bad rows skipped, {self.truncated} truncated and {self.dropped} dropped "
                f"as longer than the sequence")


def is_raw_rows(path: str) -> bool:
    return path.endswith(RAW_SUFFIXES)


def iter_rows(path: str) -> Iterator[tuple[str, object]]:
    """(where, row) of a JSON list or a JSONL file; `where` is "path:line N" or "path:row N" (from 1)."""
    try:
        with open(path, encoding="utf-8") as handle:
            head = handle.read(4096).lstrip()
            handle.seek(0)
            if head.startswith("["):
                try:
                    rows = json.load(handle)
                except ValueError as err:
                    raise InputError(f"{path}: not a valid JSON list of rows ({err}); fix the file") from None
                for number, row in enumerate(rows, 1):
                    yield f"{path}:row {number}", row
                return
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except ValueError as err:
                        row = BadRow(f"not valid JSON ({err})")
                    yield f"{path}:line {number}", row
    except OSError as err:
        raise InputError(f"{path}: cannot read the fine-tuning data ({err.strerror or err}); give an existing "
                         f"JSON / JSONL file") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err}); give a JSON / JSONL file") from None


def fit(example: Example, limit: int, overlong: str) -> tuple[Optional[Example], str]:
    """The example within `limit` tokens: as it is, truncated (upstream's way), or None (dropped); and what was
    done ("", "truncated", "dropped")."""
    if len(example) <= limit:
        return example, ""
    if overlong == "drop":
        return None, "dropped"
    cut = Example(example.tokens[:limit], example.loss_mask[:limit])
    if not cut.loss_mask.any():
        raise BadRow(f"its prompt fills the {limit - 1}-token sequence: no answer token is left after truncation")
    return cut, "truncated"


def read_examples(rows: Iterator[tuple[str, object]], render: ExampleRenderer, seq_length: int,
                  overlong: str = "truncate", say: Callable[[str], None] = _log.warning,
                  vocab_size: Optional[int] = None, report: Optional[ReadReport] = None) -> Iterator[Example]:
    """The rows' examples fitted to seq_length + 1 tokens; the ReadReport (`report`, kept up to date as rows are
    read, or a new one) comes back as the generator's value. Each bad or dropped row is one line through `say`."""
    report = ReadReport() if report is None else report
    for where, row in rows:
        report.rows += 1
        try:
            if isinstance(row, BadRow):
                raise row
            rendered = render(row)
            example, action = fit(rendered, seq_length + 1, overlong)
            if vocab_size is not None and example is not None and example.tokens.max() >= vocab_size:
                raise BadRow(f"token id {int(example.tokens.max())} is outside the vocabulary of {vocab_size}")
        except BadRow as err:
            report.bad += 1
            say(f"{where}: skipped: {err}")
            continue
        if action == "dropped":
            report.dropped += 1
            say(f"{where}: dropped: {len(rendered)} tokens, longer than --seq-length {seq_length} + 1")
            continue
        report.truncated += action == "truncated"
        report.examples += 1
        report.tokens += len(example)
        report.answer_tokens += int(example.loss_mask.sum())
        yield example
    return report


def collect(examples: Iterator[Example]) -> tuple[list, ReadReport]:
    """read_examples run to its end: the examples and the report."""
    kept = []
    while True:
        try:
            kept.append(next(examples))
        except StopIteration as end:
            return kept, end.value


def write_indexed_examples(prefix: str, examples: Iterator[Example], vocab_size: int) -> None:
    """The examples as `<prefix>_tokens` and `<prefix>_loss_mask` indexed datasets (one item and document each),
    both finished or neither."""
    with MMapIndexedDatasetBuilder(prefix + TOKENS_SUFFIX, best_fitting_dtype(vocab_size)) as tokens, \
            MMapIndexedDatasetBuilder(prefix + LOSS_MASK_SUFFIX, np.uint8) as masks:
        for example in examples:
            tokens.add_item(example.tokens)
            tokens.end_document()
            masks.add_item(example.loss_mask)
            masks.end_document()


class IndexedExamples:
    """The examples of a preprocessed prefix, read from the memory-mapped files on demand."""

    def __init__(self, prefix: str):
        for suffix in (TOKENS_SUFFIX, LOSS_MASK_SUFFIX):
            if not os.path.isfile(prefix + suffix + ".idx"):
                raise InputError(f"--data-path {prefix}: no {prefix + suffix}.idx; give a .json / .jsonl file of "
                                 f"rows, or the --output-prefix of tools/preprocess_sft_data.py")
        self.tokens = MMapIndexedDataset(prefix + TOKENS_SUFFIX)
        self.masks = MMapIndexedDataset(prefix + LOSS_MASK_SUFFIX)
        if not np.array_equal(self.tokens.sizes, self.masks.sizes):
            raise InputError(f"--data-path {prefix}: its token and loss-mask files hold different examples (written "
                             "by different runs?); preprocess the rows again")

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> Example:
        return Example(np.asarray(self.tokens[index], dtype=np.int64), np.asarray(self.masks[index]))

    def lengths(self) -> np.ndarray:
        return np.asarray(self.tokens.sizes, dtype=np.int64)


class ExampleList(list):
    """Examples held in memory (rendered from JSON at start-up)."""

    def lengths(self) -> np.ndarray:
        return np.fromiter((len(example) for example in self), dtype=np.int64, count=len(self))


class PaddedExamples:
    """Sample i: example i mod N (epochs in file order, as upstream's repeated data loader reads them), padded to
    `limit` tokens."""

    def __init__(self, examples, limit: int, pad: int, num_samples: int):
        self.examples, self.limit, self.pad, self.num_samples = examples, limit, pad, num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict:
        example = self.examples[index % len(self.examples)]
        return padded_sample([example], self.limit, self.pad)


class PackedExamples:
    """Sample i: bin i mod B, a run of consecutive examples whose lengths add up to at most `limit` (each bin
    filled in file order until the next example does not fit), padded, with each token's example index."""

    def __init__(self, examples, limit: int, pad: int, num_samples: int):
        self.examples, self.limit, self.pad, self.num_samples = examples, limit, pad, num_samples
        self.bins = pack_bins(examples.lengths(), limit)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict:
        first, end = self.bins[index % len(self.bins)]
        return padded_sample([self.examples[i] for i in range(first, end)], self.limit, self.pad)


def pack_bins(lengths: np.ndarray, limit: int) -> list:
    """[(first, end)] of consecutive examples, each run's total length at most `limit` (every length is)."""
    bins, first, total = [], 0, 0
    for index, length in enumerate(lengths.tolist()):
        if total + length > limit:
            bins.append((first, index))
            first, total = index, 0
        total += length
    if len(lengths):
        bins.append((first, len(lengths)))
    return bins


def padded_sample(examples: list, limit: int, pad: int) -> dict:
    """{"text", "loss_mask", "segment_ids"}: the examples back to back, then pad tokens (never targets) up to
    `limit`; segment_ids number the examples from 0, the padding the next number."""
    text = np.full(limit, pad, dtype=np.int64)
    mask = np.zeros(limit, dtype=np.uint8)
    segments = np.full(limit, len(examples), dtype=np.int64)
    start = 0
    for number, example in enumerate(examples):
        end = start + len(example)
        text[start:end], mask[start:end], segments[start:end] = example.tokens, example.loss_mask, number
        start = end
    return {"text": text, "loss_mask": mask, "segment_ids": segments}
