"""Fine-tuning rows preprocessed once: the indexed pair holds what rendering gives, progress and bad rows are
lines, a file without one usable row writes nothing; the command line is a thin layer over it, and a run reads the
pair as it reads the rows."""
import os

import pytest

from megatron.data.sft_data import renderer_for
from megatron.data.sft_dataset import IndexedExamples, collect, iter_rows, read_examples
from megatron.data.sft_preprocess import preprocess_rows
from megatron.errors import InputError
from megatron.tokenizer import build_tokenizer
from tests.helpers.sft import ALPACA_ROWS, CHAT_ROWS, SEQ, write_chat_llama, write_rows


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return write_chat_llama(str(tmp_path_factory.mktemp("llama")))


def test_the_indexed_pair_holds_the_rendered_examples_with_progress_and_bad_rows_said(tokenizer_dir, tmp_path):
    from tools.preprocess_sft_data import main

    rows = [*ALPACA_ROWS[:2], {"prompt": "x"}, *CHAT_ROWS[:2]]
    path = write_rows(str(tmp_path / "rows.jsonl"), rows)
    lines = []
    tokenizer = build_tokenizer("HFTokenizer", tokenizer_model=tokenizer_dir)
    report = preprocess_rows(path, str(tmp_path / "sft"), renderer_for(tokenizer), tokenizer.vocab_size, SEQ,
                             log_interval=2, say=lines.append)
    assert (report.rows, report.examples, report.bad) == (5, 4, 1)
    assert lines[:3] == [lines[0], f"{path}:line 3: skipped: has keys ['prompt'], none of the formats: alpaca "
                         "(instruction, input, output), prompt/completion, messages (role, content), conversations "
                         "(from, value)", lines[2]]
    assert lines[0].startswith("processed 2 rows (") and lines[2].startswith("processed 4 rows (")
    assert lines[-1] == report.summary(path)
    expected, _ = collect(read_examples(iter_rows(path), renderer_for(tokenizer), SEQ, say=lambda line: None))
    stored = IndexedExamples(str(tmp_path / "sft"))
    assert [stored[i].tokens.tolist() for i in range(len(stored))] == [e.tokens.tolist() for e in expected]
    assert [stored[i].loss_mask.tolist() for i in range(len(stored))] == [e.loss_mask.tolist() for e in expected]
    main(["--input", path, "--output-prefix", str(tmp_path / "cli"), "--tokenizer-type", "HFTokenizer",
          "--tokenizer-model", tokenizer_dir, "--seq-length", str(SEQ)])
    for suffix in ("_tokens.bin", "_tokens.idx", "_loss_mask.bin", "_loss_mask.idx"):
        with open(tmp_path / f"sft{suffix}", "rb") as ours, open(tmp_path / f"cli{suffix}", "rb") as theirs:
            assert ours.read() == theirs.read()


def test_no_usable_row_writes_nothing(tokenizer_dir, tmp_path):
    path = write_rows(str(tmp_path / "rows.jsonl"), [{"prompt": "x"}])
    tokenizer = build_tokenizer("HFTokenizer", tokenizer_model=tokenizer_dir)
    with pytest.raises(InputError, match="no usable example among 1 rows"):
        preprocess_rows(path, str(tmp_path / "sft"), renderer_for(tokenizer), tokenizer.vocab_size, SEQ,
                        say=lambda line: None)
    assert os.listdir(tmp_path) == ["rows.jsonl"]
