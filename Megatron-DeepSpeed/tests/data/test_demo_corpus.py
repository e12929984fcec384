"""The corpus that needs no download (megatron/data/demo_corpus.py): long docstrings of the standard library in a
fixed order, written as JSONL within a byte budget, atomically."""
import json
import os

import pytest

from megatron.data.demo_corpus import iter_stdlib_docstrings, write_demo_corpus


def test_the_corpus_is_jsonl_within_its_budget(tmp_path):
    path = tmp_path / "corpus.jsonl"
    documents, written = write_demo_corpus(str(path), max_bytes=20_000)
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == documents > 3 and written == os.path.getsize(path) <= 20_000
    texts = [json.loads(line)["text"] for line in lines]
    assert texts == [text for _, text in zip(range(documents), iter_stdlib_docstrings())]  # the same order again
    assert all(text == text.strip() for text in texts)
    assert os.listdir(tmp_path) == ["corpus.jsonl"]


def test_a_failed_write_leaves_no_temporary(tmp_path):
    (tmp_path / "corpus").mkdir()
    with pytest.raises(IsADirectoryError):
        write_demo_corpus(str(tmp_path / "corpus"), max_bytes=2000)  # written, then the rename onto a directory fails
    assert os.listdir(tmp_path) == ["corpus"] and os.listdir(tmp_path / "corpus") == []
