"""Fine-tuning rows tokenized once into the indexed pair that finetune_llama.py reads (sft_dataset), so that the
ranks of a run do not each render and tokenize them: progress every few rows, each bad or dropped row one line,
and a summary."""
import time
from typing import Callable

from megatron.data.sft_dataset import ReadReport, iter_rows, read_examples, write_indexed_examples
from megatron.data.sft_examples import ExampleRenderer
from megatron.errors import InputError
from megatron.tokenizer import require_positive_int


def preprocess_rows(input_path: str, output_prefix: str, render: ExampleRenderer, vocab_size: int, seq_length: int,
                    overlong: str = "truncate", log_interval: int = 1000, say: Callable[[str], None] = print
                    ) -> ReadReport:
    """`input_path`'s rows as `<output_prefix>_tokens` and `<output_prefix>_loss_mask`; returns what became of
    them. Nothing is written when no row gives an example."""
    seq_length, log_interval = require_positive_int("--seq-length", seq_length), \
        require_positive_int("--log-interval", log_interval)
    report, started = ReadReport(), time.monotonic()
    examples = read_examples(iter_rows(input_path), render, seq_length, overlong, say, vocab_size, report)

    def with_progress():
        for example in examples:
            yield example
            if report.rows % log_interval == 0:
                elapsed = max(time.monotonic() - started, 1e-9)
                say(f"processed {report.rows} rows ({report.rows / elapsed:.1f} rows/s): {report.examples} examples, "
                    f"{report.tokens} tokens, {report.bad} bad")
        if not report.examples:  # raised while the files are being written: the writers remove them
            raise InputError(f"--input {input_path}: no usable example among {report.rows} rows (each was reported "
                             "above); nothing written")

    write_indexed_examples(output_prefix, with_progress(), vocab_size)
    say(report.summary(input_path))
    return report
