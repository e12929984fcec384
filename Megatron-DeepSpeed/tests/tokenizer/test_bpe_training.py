"""Training a byte-level BPE vocab: GPT-2 file format, determinism, atomic output, and the CLI that
streams a JSONL corpus into it."""
import gzip
import json
import os
import subprocess
import sys

import pytest
from tests.helpers.gpt2_reference_bpe import ReferenceGPT2Encoder, byte_to_char_table, docstring_corpus

from megatron.errors import InputError
from megatron.tokenizer.bpe_training import train_bpe_vocab
from megatron.tokenizer.gpt2_bpe import GPT2BPETokenizer

from tests.helpers.paths import PACKAGE_ROOT

ROOT = PACKAGE_ROOT
TOOL = os.path.join(ROOT, "tools", "train_bpe_vocab.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import train_bpe_vocab as tool  # noqa: E402

VOCAB_SIZE = 700


@pytest.fixture(scope="module")
def corpus():
    return docstring_corpus()


@pytest.fixture(scope="module")
def trained_dir(corpus, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("trained")
    train_bpe_vocab(iter(corpus), VOCAB_SIZE, output_dir)
    return output_dir


def read_bytes(directory):
    return {name: (directory / name).read_bytes() for name in ("vocab.json", "merges.txt")}


def write_jsonl(path, documents, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for document in documents:
            f.write(json.dumps(document) + "\n")


def test_output_is_gpt2_format(trained_dir):
    assert sorted(os.listdir(trained_dir)) == ["merges.txt", "vocab.json"]  # no staging leftovers
    vocab = json.loads((trained_dir / "vocab.json").read_text(encoding="utf-8"))
    lines = (trained_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2"
    assert len(vocab) == VOCAB_SIZE
    assert sorted(vocab.values()) == list(range(VOCAB_SIZE))
    assert "<|endoftext|>" in vocab
    assert set(byte_to_char_table().values()) <= set(vocab)  # all 256 bytes, even those never seen
    merges = [line.split() for line in lines[1:]]
    assert len(merges) == VOCAB_SIZE - 257
    assert all(len(parts) == 2 and parts[0] + parts[1] in vocab for parts in merges)


def test_trained_vocab_loads_and_matches_reference(trained_dir, corpus):
    files = str(trained_dir / "vocab.json"), str(trained_dir / "merges.txt")
    tokenizer = GPT2BPETokenizer(*files)
    reference = ReferenceGPT2Encoder(*files)
    assert tokenizer.vocab_size == VOCAB_SIZE
    for text in corpus[::10]:
        assert tokenizer.tokenize(text) == reference.encode(text)


def test_deterministic(trained_dir, corpus, tmp_path):
    train_bpe_vocab(corpus, VOCAB_SIZE, tmp_path)
    assert read_bytes(tmp_path) == read_bytes(trained_dir)


def test_failed_training_keeps_previous_files(corpus, tmp_path):
    train_bpe_vocab(corpus[:100], 300, tmp_path)
    before = read_bytes(tmp_path)

    def texts_then_failure():
        yield from corpus
        raise InputError("corpus.jsonl:7: broken")

    with pytest.raises(InputError, match="corpus.jsonl:7"):
        train_bpe_vocab(texts_then_failure(), VOCAB_SIZE, tmp_path)
    assert read_bytes(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == ["merges.txt", "vocab.json"]


@pytest.mark.parametrize("vocab_size", [256, "8192", None])
def test_vocab_size_too_small_or_not_int(vocab_size, tmp_path):
    with pytest.raises(InputError, match="--vocab-size"):
        train_bpe_vocab(["some text"], vocab_size, tmp_path)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- the CLI

def test_cli_reads_gz_and_globs_in_order(corpus, tmp_path):
    half = len(corpus) // 2
    write_jsonl(tmp_path / "part1.jsonl.gz", [{"text": t, "id": i} for i, t in enumerate(corpus[:half])], gzip.open)
    write_jsonl(tmp_path / "part2.jsonl", [{"text": t} for t in corpus[half:]])
    tool.main(["--input", str(tmp_path / "part*"), "--vocab-size", "400", "--output-dir", str(tmp_path / "cli")])
    train_bpe_vocab(corpus, 400, tmp_path / "api")
    assert read_bytes(tmp_path / "cli") == read_bytes(tmp_path / "api")


def test_cli_several_json_keys(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", [{"title": "aaaa bbbb", "body": "cccc dddd"}] * 5)
    tool.main(["--input", str(tmp_path / "c.jsonl"), "--json-keys", "title", "body", "--vocab-size", "300",
               "--output-dir", str(tmp_path / "out")])
    vocab = json.loads((tmp_path / "out" / "vocab.json").read_text(encoding="utf-8"))
    assert {"aaaa", "Ġbbbb", "cccc", "Ġdddd"} <= set(vocab)


@pytest.mark.parametrize("bad_line, message", [
    ('{"text": "ok", ', "c.jsonl:3: not valid JSON"),
    ('["text"]', "c.jsonl:3: expected a JSON object, got list"),
    ('{"body": "no text key"}', "c.jsonl:3: key 'text' is missing"),
    ('{"text": null}', "c.jsonl:3: key 'text' is not a string \\(got NoneType\\)"),
])
def test_cli_bad_lines_name_file_and_line(bad_line, message, tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "one"}\n\n' + bad_line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=message):
        tool.main(["--input", str(tmp_path / "c.jsonl"), "--output-dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_cli_broken_gzip(tmp_path):
    (tmp_path / "c.jsonl.gz").write_bytes(b'{"text": "not compressed"}\n')
    with pytest.raises(InputError, match="--input .*c.jsonl.gz: cannot read it"):
        tool.main(["--input", str(tmp_path / "c.jsonl.gz"), "--output-dir", str(tmp_path / "out")])


def test_cli_as_a_script_from_another_directory(corpus, tmp_path):
    """`python tools/train_bpe_vocab.py` works from any cwd, gives the bytes the API gives in this process
    (training is deterministic across processes), and reports bad input in one line with exit code 2."""
    write_jsonl(tmp_path / "c.jsonl", [{"text": text} for text in corpus[:150]])
    run = [sys.executable, TOOL, "--vocab-size", "500", "--output-dir", str(tmp_path / "cli")]
    ok = subprocess.run(run + ["--input", str(tmp_path / "c.jsonl")], cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "wrote" in ok.stderr
    train_bpe_vocab(corpus[:150], 500, tmp_path / "api")
    assert read_bytes(tmp_path / "cli") == read_bytes(tmp_path / "api")

    bad = subprocess.run(run + ["--input", str(tmp_path / "missing*.jsonl")], cwd=tmp_path,
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: --input {tmp_path / 'missing*.jsonl'}: no such file and "
                                               f"no file matches it as a glob pattern"]
