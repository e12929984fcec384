"""Fine-tuning rows from JSON and JSONL files fitted to the sequence (bad, truncated, dropped rows each one line
and counted), the preprocessed indexed pair read back, padded and packed samples, and the data source's splits and
epochs."""
import numpy as np
import pytest

from megatron.data.sft_dataset import (ExampleList, IndexedExamples, PackedExamples, PaddedExamples, collect,
                                       iter_rows, pack_bins, read_examples, write_indexed_examples)
from megatron.data.sft_examples import Example, ExampleRenderer
from megatron.errors import InputError
from tests.helpers.sft import write_rows


def char_renderer() -> ExampleRenderer:
    """One token per character (ord), EOS 1: lengths are plain to see."""
    return ExampleRenderer(lambda text: [ord(c) for c in text], 1)


def read(path: str, seq_length: int, overlong: str = "truncate"):
    lines = []
    examples, report = collect(read_examples(iter_rows(path), char_renderer(), seq_length, overlong, lines.append))
    return examples, report, lines


def test_bad_rows_are_one_line_each_and_counted(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "ab", "completion": "cd"}\n{"prompt": "ab"}\nnot json\n\n'
                    '{"instruction": "x", "output": ""}\n')
    examples, report, lines = read(str(path), 16)
    assert [example.tokens.tolist() for example in examples] == [[ord("a"), ord("b"), ord("c"), ord("d"), 1]]
    assert examples[0].loss_mask.tolist() == [0, 0, 1, 1, 1]
    assert (report.rows, report.examples, report.bad) == (4, 1, 3)
    assert lines == [f"{path}:line 2: skipped: has keys ['prompt'], none of the formats: alpaca (instruction, input, "
                     "output), prompt/completion, messages (role, content), conversations (from, value)",
                     f"{path}:line 3: skipped: not valid JSON (Expecting value: line 1 column 1 (char 0))",
                     f"{path}:line 5: skipped: 'output' is empty: nothing to train on"]


def test_overlong_examples_are_truncated_as_upstream_or_dropped_and_a_filled_prompt_is_bad(tmp_path):
    rows = [{"prompt": "abc", "completion": "defghij"}, {"prompt": "abcdefghij", "completion": "k"},
            {"prompt": "ab", "completion": "c"}]
    path = write_rows(str(tmp_path / "rows.json"), rows, as_list=True)
    examples, report, lines = read(path, 5)  # 6 tokens a sample
    assert [len(example) for example in examples] == [6, 4]
    assert examples[0].loss_mask.tolist() == [0, 0, 0, 1, 1, 1]
    assert (report.truncated, report.bad, report.dropped) == (1, 1, 0)
    assert lines == [f"{path}:row 2: skipped: its prompt fills the 5-token sequence: no answer token is left after "
                     "truncation"]
    examples, report, lines = read(path, 5, "drop")
    assert [len(example) for example in examples] == [4] and (report.dropped, report.bad) == (2, 0)
    assert lines[0] == f"{path}:row 1: dropped: 11 tokens, longer than --seq-length 5 + 1"


def test_a_missing_or_broken_file_is_one_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read the fine-tuning data"):
        list(iter_rows(str(tmp_path / "absent.json")))
    (tmp_path / "broken.json").write_text('[{"prompt": ')
    with pytest.raises(InputError, match="not a valid JSON list of rows"):
        list(iter_rows(str(tmp_path / "broken.json")))


def examples_of(*lengths) -> ExampleList:
    return ExampleList(Example.of(np.arange(10, 10 + length), np.arange(length) >= length // 2) for length in lengths)


def test_indexed_examples_read_back_what_was_written(tmp_path):
    examples = examples_of(3, 5, 4)
    write_indexed_examples(str(tmp_path / "sft"), iter(examples), vocab_size=100)
    stored = IndexedExamples(str(tmp_path / "sft"))
    assert len(stored) == 3 and stored.lengths().tolist() == [3, 5, 4]
    for kept, original in zip((stored[i] for i in range(3)), examples):
        assert kept.tokens.tolist() == original.tokens.tolist()
        assert kept.loss_mask.tolist() == original.loss_mask.tolist()
    with pytest.raises(InputError, match="no .*_tokens.idx"):
        IndexedExamples(str(tmp_path / "other"))


def test_padded_samples_repeat_the_examples_in_file_order():
    dataset = PaddedExamples(examples_of(3, 5), limit=6, pad=0, num_samples=5)
    assert len(dataset) == 5
    assert [dataset[i]["text"].tolist() for i in (0, 1, 2)] == [[10, 11, 12, 0, 0, 0], [10, 11, 12, 13, 14, 0],
                                                                [10, 11, 12, 0, 0, 0]]
    assert dataset[0]["loss_mask"].tolist() == [0, 1, 1, 0, 0, 0]


def test_packing_fills_each_sequence_with_whole_examples_in_order():
    assert pack_bins(np.array([3, 2, 4, 6, 1]), 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    dataset = PackedExamples(examples_of(3, 2, 4), limit=6, pad=0, num_samples=2)
    sample = dataset[0]
    assert sample["text"].tolist() == [10, 11, 12, 10, 11, 0]
    assert sample["loss_mask"].tolist() == [0, 1, 1, 0, 1, 0]
    assert sample["segment_ids"].tolist() == [0, 0, 0, 1, 1, 2]
    assert dataset[1]["segment_ids"].tolist() == [0, 0, 0, 0, 1, 1]
